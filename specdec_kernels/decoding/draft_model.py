"""Draft-model speculative decoding: a smaller causal LM sharing the target's tokenizer drafts
``K`` tokens per step; its own preallocated cache is rolled back by the same KV op."""

from __future__ import annotations

import numbers
import weakref

import torch
from torch import Tensor

from specdec_kernels.decoding import calibration
from specdec_kernels.decoding.chain_drafter import AutoregressiveDrafter
from specdec_kernels.decoding.draft_vocabulary import (
    draft_vocabulary,
    restricted_head_copy,
    token_ranking,
)
from specdec_kernels.decoding.drafter import DecodeState, StepOutcome
from specdec_kernels.decoding.runner import ModelRunner

__all__ = ["DraftModelDrafter", "check_same_vocabulary"]

# Restricted-head copies per draft model object and (ranking, size): gathering the head's rows
# of a large vocabulary takes a moment, and a drafter binds once per generate call.
_RESTRICTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def check_same_vocabulary(target_tokenizer, draft_tokenizer) -> None:
    """Raise ``ValueError`` unless both tokenizers map the same strings to the same ids."""
    if target_tokenizer is None or draft_tokenizer is None:
        return
    target_vocab = target_tokenizer.get_vocab()
    draft_vocab = draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = sum(1 for tok, i in draft_vocab.items() if target_vocab.get(tok) != i)
        raise ValueError(
            "the draft model's tokenizer does not match the target's "
            f"(vocabularies of {len(draft_vocab)} and {len(target_vocab)} entries, "
            f"{differing} draft entries missing or with another id); speculative decoding "
            "needs a draft model with the target's tokenizer"
        )


class DraftModelDrafter(AutoregressiveDrafter):
    """Drafts with a separate (smaller) causal LM.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The draft model, on the target's device; unmodified.
    tokenizer : optional
        The draft model's tokenizer; when given (and the target's is known) the vocabularies
        must match exactly.
    narrow_kv : bool
        Keep the draft model's K/V in its runner's narrower dtype where it has one (bfloat16
        for a float32 draft model on the package's CPU kernels, see
        :meth:`~specdec_kernels.decoding.runner.ModelRunner.narrow_kv_dtype`; elsewhere its own
        dtype): half the bytes its attention reads, K/V rounded to bfloat16. Draft quality
        only; the output stays the target's.
    draft_vocab : int, optional
        Score only this many tokens, the most frequent ones, with the draft's LM head (see
        :mod:`~specdec_kernels.decoding.draft_vocabulary`); ``None`` (default): all of them.
    token_ranking : str, optional
        The ranking file that says which tokens (``specdec draft-vocab``); default: the
        package's for the default model's tokenizer, else token ids in order.
    num_draft, adaptive, min_draft, max_draft, confidence_threshold, budget, cost_curve, draft_cost_curve
        See :class:`~specdec_kernels.decoding.chain_drafter.AutoregressiveDrafter`.
    """

    name = "draft-model"

    def __init__(self, model, *, tokenizer=None, num_draft: int = 4, narrow_kv: bool = True,
                 draft_vocab: int | None = None, token_ranking: str | None = None, **kwargs):
        super().__init__(num_draft, **kwargs)
        self._vocabulary_options(draft_vocab, token_ranking)
        self.model = model
        self.tokenizer = tokenizer
        self.narrow_kv = narrow_kv
        self.runner = ModelRunner(model)
        self.cache = None

    def _vocabulary_options(self, draft_vocab: int | None, ranking: str | None) -> None:
        whole = isinstance(draft_vocab, numbers.Integral) and not isinstance(draft_vocab, bool)
        if draft_vocab is not None and (not whole or draft_vocab < 1):
            raise ValueError(f"draft_vocab must be a positive integer or None, got {draft_vocab!r}")
        self.draft_vocab = None if draft_vocab is None else int(draft_vocab)
        self.token_ranking = ranking
        self._ranking_source = None

    @classmethod
    def from_options(cls, options, context) -> "DraftModelDrafter":
        from specdec_kernels.drafters import option_values

        return cls(context.draft_model, tokenizer=context.draft_tokenizer,
                   **option_values(options))

    def bind(self, runner: ModelRunner, tokenizer) -> None:
        super().bind(runner, tokenizer)
        self.runner.cpu_kernels = runner.cpu_kernels
        if self.runner.device != runner.device:
            raise ValueError(
                f"the draft model is on {self.runner.device}, the target on {runner.device}; "
                "put both on one device"
            )
        check_same_vocabulary(tokenizer, self.tokenizer)
        if self.tokenizer is None or tokenizer is None:
            draft_vocab = getattr(self.runner.config, "vocab_size", self.runner.vocab_size)
            target_vocab = getattr(runner.config, "vocab_size", runner.vocab_size)
            if draft_vocab != target_vocab:
                raise ValueError(
                    f"the draft model's vocabulary ({draft_vocab}) differs from the target's "
                    f"({target_vocab}); speculative decoding needs a shared tokenizer"
                )
        self._vocab_ids = None
        if self.draft_vocab is not None:
            self._restrict_head(runner, tokenizer)

    def _restrict_head(self, runner: ModelRunner, tokenizer) -> None:
        """Draft through a copy of the draft model whose LM head scores the ``draft_vocab``
        most frequent tokens only."""
        if self.draft_vocab > runner.vocab_size:
            raise ValueError(f"draft_vocab: {self.draft_vocab} exceeds the vocabulary of "
                             f"{runner.vocab_size} tokens")
        order, self._ranking_source = token_ranking(tokenizer, runner.vocab_size,
                                                    self.token_ranking)
        key = (self.token_ranking, self._ranking_source, self.draft_vocab)
        copies = _RESTRICTED.setdefault(self.model, {})
        if key not in copies:
            ids = draft_vocabulary(order, self.draft_vocab)
            copies[key] = (restricted_head_copy(self.model, ids), ids)
        restricted, ids = copies[key]
        self.runner = ModelRunner(restricted)
        self.runner.cpu_kernels = runner.cpu_kernels
        self._vocab_ids = ids.to(runner.device)

    def describe(self) -> dict:
        out = super().describe()
        out["model"] = getattr(self.model.config, "_name_or_path", type(self.model).__name__)
        out["kv_dtype"] = str(self._kv_dtype() or self.runner.dtype).removeprefix("torch.")
        if self.draft_vocab is not None:
            out["draft_vocab"] = self.draft_vocab
            out["token_ranking"] = self._ranking_source or self.token_ranking
        return out

    def _kv_dtype(self) -> torch.dtype | None:
        """The draft cache's dtype (None: the draft model's)."""
        return self.runner.narrow_kv_dtype() if self.narrow_kv else None

    def start(self, state: DecodeState) -> None:
        super().start(state)
        self.cache = self.runner.new_cache(state.batch, state.cache.capacity, self._kv_dtype())
        self._fill_cache(state)

    def _fill_cache(self, state: DecodeState) -> None:
        """Put each context's committed rows (all but its pending token) into the draft's
        cache: a prefill of the draft model."""
        self.runner.prefill(self.cache, [ctx[:-1] for ctx in state.contexts])

    def _draft_cost(self, runner) -> dict | None:
        return calibration.machine_draft_cost(runner, self.runner)

    def _first_logits(self, state: DecodeState) -> Tensor:
        # Catch up with every emitted token the draft has not seen (the pending token, and
        # the last accepted draft after a fully accepted step): rows are committed at once.
        behind = [ctx[n:] for ctx, n in zip(state.contexts, self.cache.host_lens)]
        return self.runner.append(self.cache, behind, want_logits=True)

    def _next_logits(self, state: DecodeState, tokens: Tensor, depth: int) -> Tensor:
        starts = [n + depth - 1 for n in self.cache.host_lens]
        return self.runner.forward(self.cache, tokens[:, None], starts)[:, -1]

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        super().accept(state, outcome)
        # Drafts 1 .. drafted-1 were run through the draft model; keep those accepted.
        keep = [min(n, max(self._drafted - 1, 0)) for n in outcome.num_accepted]
        if any(keep):
            width = max(keep)
            lens = self.cache.lens
            cols = torch.arange(width, device=lens.device)
            counts = torch.tensor(keep, dtype=torch.int64).to(lens.device, non_blocking=True)
            positions = torch.where(
                cols[None, :] < counts[:, None], lens[:, None] + cols, torch.full_like(cols, -1)
            )
            self.cache.compact(positions, counts)
            self.cache.advance_host(keep)

    def select_requests(self, keep: list) -> None:
        super().select_requests(keep)
        self.cache.select_requests(keep)

    def finish(self) -> None:
        self.runner.release()
