"""The target as its own prophet, compressed: a copy of the target whose linear layers hold
int4 or int8 weights (groups along K with per-group scales, run by
:func:`specdec_kernels.ops.quantized_linear`) drafts ``K`` tokens with its own cache, exactly
like a separate draft model (:class:`~specdec_kernels.decoding.draft_model.DraftModelDrafter`).
No training, and it agrees with the target far more often than a smaller model would.

Or, for a target held at higher precision than its GGUF file (``load_model(...,
weights="float32")``), the file's own quantized weights draft (``gguf=path``).

The copy shares everything but the quantized linears with the target (embeddings, norms): its
resident cost is the quantized weights alone. Its cache starts as a copy of the target's after
the prompt's prefill (same layers, heads and head size), so the prompt is run once: prefilling
the copy through the integer kernel, compute-bound at hundreds of rows, cost about what the
target's prefill does and ate the decoding gain on long prompts. The copy's drafts then attend
to the target's K/V for the prompt and to its own for the rows after it; verification keeps the
output the target's either way.
"""

from __future__ import annotations

import sys
import weakref

import torch

from specdec_kernels.decoding.draft_model import DraftModelDrafter
from specdec_kernels.decoding.draft_vocabulary import shared_copy
from specdec_kernels.decoding.drafter import DecodeState
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models.quantized_weight import (
    QuantizedWeight,
    RerankedWeight,
    quantize_model,
    quantize_weight,
    set_weight,
)

__all__ = ["QuantizedSelfDrafter", "quantized_copy"]

#: The smallest group along K the kernel takes per weight bits.
SMALLEST_GROUP = {4: 32, 8: 16}

# One quantized copy per (target model object, bits, group): quantizing takes seconds.
_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_GGUF_DRAFTS: dict = {}
# Targets already told (on stderr) that their weights are quantized already.
_TOLD: "weakref.WeakSet" = weakref.WeakSet()


def quantized_copy(model, bits: int = 4, group: int = 32, head_bits: int | None = None,
                   rerank: int = 0):
    """A copy of ``model`` whose ``nn.Linear`` weights are quantized to ``bits`` (4 or 8) in
    groups of ``group`` values along K (see
    :func:`~specdec_kernels.models.quantized_weight.quantize_weight`), the LM head to
    ``head_bits`` (default ``bits``; in groups of at least :data:`SMALLEST_GROUP` for its
    bits, an int8 copy's groups of 16 being too small for an int4 head); every other tensor is
    shared with ``model``, which is
    left untouched. Weights already quantized (a model loaded at its GGUF file's precision) are
    kept as they are. ``rerank > 0``: the quantized head's ``rerank`` best logits of every row
    are computed again with ``model``'s own (dense) head rows
    (:class:`~specdec_kernels.models.quantized_weight.RerankedWeight`).

    Raises
    ------
    ValueError
        ``bits`` or ``group`` not supported, or a model that is not float32 / bfloat16.
    """
    first = next(model.parameters())
    if first.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"model: quantized-self needs a float32 or bfloat16 model, got {first.dtype}")
    # Share every tensor, then swap the copy's linear weights for quantized ones.
    clone = shared_copy(model)
    head = clone.get_output_embeddings() if hasattr(clone, "get_output_embeddings") else None
    head_group = max(group, SMALLEST_GROUP[head_bits]) if head_bits in SMALLEST_GROUP else group
    if (head_bits not in (None, bits) and isinstance(head, torch.nn.Linear)
            and not isinstance(head.weight, QuantizedWeight)
            and head.weight.shape[1] % head_group == 0):
        # Quantized first, so quantize_model keeps it (a tied embedding keeps the float one).
        set_weight(head, quantize_weight(head.weight, head_bits, head_group))
    clone = quantize_model(clone, bits, group).eval()
    dense = getattr(model.get_output_embeddings(), "weight", None) if head is not None else None
    if (rerank and isinstance(getattr(head, "weight", None), QuantizedWeight)
            and isinstance(dense, torch.Tensor) and not isinstance(dense, QuantizedWeight)):
        set_weight(head, RerankedWeight(head.weight, dense.detach(), rerank))
    return clone


class QuantizedSelfDrafter(DraftModelDrafter):
    """Drafts with a quantized copy of the target.

    Parameters
    ----------
    num_draft : int
        Drafts per step ``K`` (the start value when ``adaptive``); the budget may draft fewer.
        11 by default: with the re-scored head (``rerank``) the copy agrees with the target
        on ~98% of tokens, and a block of 12 rows costs little more than one row. The default
        model, float32, 12 tuning prompts x 128 tokens, 2026-11-28
        (`results/cpu-2026-11-28/session21/ab_head*.txt`): with the int4 head re-scored,
        K = 11 gave 1.10x the tokens/s of K = 7 with the int8 head on AVX-512 (K = 9 1.06x,
        K = 13 1.10x, K = 15 1.09x) and 1.04x on the AVX2 path (K = 13 1.02x), 1.06x at
        temperature 0.7 (AVX-512).
    bits : int
        4 (default: about a seventh of the float32 weight bytes) or 8.
    group : int
        Values per scale along K (a power of two, >= 32 for 4 bits, >= 16 for 8 bits).
    head_bits : int
        The LM head's bits, 4 (default) or 8. Alone, an int4 head loses agreement (a 4-bit
        file keeps its output matrix at 6-8 bits for this reason, llama.cpp's Q4_K_M: Q6_K):
        the default model's int4 copy agreed with the target's next token on 84.9% of
        positions with an int4 head, 96.5% with an int8 head (dense: 97.1%; teacher-forced over
        300 tokens of 5 dev prompts, 2026-11-28). Re-scored (``rerank``), the int4 head agrees
        as the dense one does and reads 12 MB less a draft forward than the int8 head.
    rerank : int
        The head's ``rerank`` best logits of every row computed again with the target's own
        head rows (shared, no copy; see
        :class:`~specdec_kernels.models.quantized_weight.RerankedWeight`); 0 turns it off.
        4 by default: over 768 teacher-forced positions of the default model's answers, the
        int4 head's top 4 re-scored agreed with the target on 97.9% (top 2: 97.3%; int8 head
        97.4%, dense 97.9%), for ~0.1 ms a draft forward (the draft token: 0.228 of the float32
        target token against 0.237 with the int8 head, `bench.quantized_cost`, AVX-512).
    gguf : str, optional
        Draft with this GGUF file's own weights instead (the target's file, for a target
        loaded at higher precision); ``bits`` and ``group`` are then the file's.
    draft_vocab, token_ranking
        The copy's LM head over the ``draft_vocab`` most frequent tokens only (see
        :class:`~specdec_kernels.decoding.draft_model.DraftModelDrafter`).
    narrow_kv : bool
        The copy's K/V in bfloat16 (default; see
        :class:`~specdec_kernels.decoding.draft_model.DraftModelDrafter`): a draft forward
        reads 84 MB of weights and, 700 tokens into a request, 32 MB of float32 K/V. The
        default model, 12 dev prompts x 128 tokens, 2026-11-28 (nineteenth session): τ
        unchanged (5.50 AVX-512, 5.38 AVX2), drafting 3-5% faster, 148-150 → 149-151 tokens/s
        (AVX-512) and 138-140 → 142-143 (AVX2).
    adaptive, min_draft, max_draft, confidence_threshold, budget, cost_curve, draft_cost_curve
        See :class:`~specdec_kernels.decoding.chain_drafter.AutoregressiveDrafter`.
    """

    name = "quantized-self"
    #: Measured: the int4 copy of the default model, held-out prompts, first draft 0.76.
    first_draft_prior = 0.75

    def __init__(self, *, num_draft: int = 11, bits: int = 4, group: int = 32, head_bits: int = 4,
                 rerank: int = 4, gguf: str | None = None, narrow_kv: bool = True,
                 draft_vocab: int | None = None, token_ranking: str | None = None, **kwargs):
        # The draft model is the target's copy, made when the target is known (bind).
        super(DraftModelDrafter, self).__init__(num_draft, **kwargs)
        self._vocabulary_options(draft_vocab, token_ranking)
        self.narrow_kv = narrow_kv
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        if head_bits not in (4, 8):
            raise ValueError(f"head_bits must be 4 or 8, got {head_bits}")
        smallest = SMALLEST_GROUP[bits]
        if group < smallest or group & (group - 1):
            raise ValueError(f"group must be a power of two >= {smallest} for {bits} bits, got {group}")
        if isinstance(rerank, bool) or not isinstance(rerank, int) or not 0 <= rerank <= 64:
            raise ValueError(f"rerank must be an integer in [0, 64], got {rerank!r}")
        self.bits, self.group, self.head_bits, self.gguf = bits, group, head_bits, gguf
        self.rerank = rerank
        self.model = None
        self.tokenizer = None
        self.runner = None
        self.cache = None

    @classmethod
    def from_options(cls, options, context) -> "QuantizedSelfDrafter":
        from specdec_kernels.drafters import option_values

        return cls(**option_values(options))  # its draft model is the target's copy

    def _draft_model(self, target, dtype):
        if self.gguf is not None:
            key = (str(self.gguf), dtype)
            if key not in _GGUF_DRAFTS:
                from specdec_kernels.models import load_model

                _GGUF_DRAFTS[key] = load_model(self.gguf, dtype=dtype, weights="file").model
            return _GGUF_DRAFTS[key]
        copies = _COPIES.setdefault(target, {})
        key = (self.bits, self.group, self.head_bits, self.rerank)
        if key not in copies:
            copies[key] = quantized_copy(target, self.bits, self.group, self.head_bits,
                                         self.rerank)
        return copies[key]

    def bind(self, runner: ModelRunner, tokenizer) -> None:
        if self.gguf is None and _quantized_linears(runner.model) and runner.model not in _TOLD:
            # The copy keeps weights that are quantized already: on a GGUF target at its
            # file's precision only the LM head changes, and the measured draft cost then
            # rarely lets a draft pay. Said once per target, since it looks like plain decoding.
            _TOLD.add(runner.model)
            print("specdec: quantized-self: the target is at its file's precision already, so "
                  "the copy keeps its weights and a draft costs about what a target forward "
                  "does (few or no drafts); the drafter speeds up a target held at higher "
                  "precision (--weights float32) with its int4 copy", file=sys.stderr)
        self.model = self._draft_model(runner.model, runner.dtype)
        self.runner = ModelRunner(self.model)
        super().bind(runner, tokenizer)

    def _fill_cache(self, state: DecodeState) -> None:
        target = state.cache.buffer
        if (target is None or target.dtype != self.runner.dtype
                or not _same_cache_layout(self.model, state.runner.model)):
            super()._fill_cache(state)  # prefill the copy itself
            return
        # The prompt's rows, as the target computed them (rounded to a narrower draft cache).
        self.cache.buffer = target.to(self.cache.dtype or target.dtype, copy=True)
        self.cache.lens = state.cache.lens.clone()
        self.cache.host_lens = list(state.cache.host_lens)

    def max_block_width(self) -> int:
        return (self.max_draft if self.adaptive else self.num_draft) + 1

    def describe(self) -> dict:
        out = super().describe() if self.model is not None else {"name": self.name}
        if self.gguf is not None:
            out["model"] = f"the GGUF file's own weights ({self.gguf})"
        else:
            head = f"LM head int{self.head_bits}"
            if isinstance(getattr(self.model.get_output_embeddings(), "weight", None), RerankedWeight):
                head += f", its top {self.rerank} re-scored with the target's rows"
            out["model"] = (f"int{self.bits} copy of the target ({head}), "
                            f"groups of {self.group} (quantized_linear)")
        return out


def _same_cache_layout(draft, target) -> bool:
    """Whether ``draft``'s KV cache rows have ``target``'s layout (layers, KV heads, head size),
    so that the target's cache can seed the draft's."""
    a, b = draft.config.get_text_config(), target.config.get_text_config()
    keys = ("num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size", "num_attention_heads")
    return all(getattr(a, k, None) == getattr(b, k, None) for k in keys)


def _quantized_linears(model) -> int:
    """How many weights of ``model`` are quantized (for tests and reports)."""
    return sum(isinstance(b, QuantizedWeight) for b in model.buffers())
