"""Drafters that run a model autoregressively for ``K`` tokens (a draft model, or the target's
own first layers), with a fixed or adaptive ``K`` and an optional confidence cut-off, each step
shortened (to nothing, when drafting does not pay) by the cost model
(:class:`~specdec_kernels.decoding.budget.ChainBudget`)."""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.decoding import calibration
from specdec_kernels.decoding.budget import ChainBudgets
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding.drafter import (
    CHAIN_LIMIT_REASON,
    MAX_CHAIN_DRAFTS,
    ChainProposal,
    DecodeState,
    Drafter,
    StepOutcome,
    check_size,
)

__all__ = ["AutoregressiveDrafter"]

# Pads draft logits up to the target's vocabulary: never drawn, finite for the sampler.
_NEVER = -1e30


class AutoregressiveDrafter(Drafter):
    """Base class: draft a chain token by token from a model's logits.

    Subclasses provide :meth:`_first_logits` (after the pending token),
    :meth:`_next_logits` (after draft ``i``) and :meth:`_draft_cost` (what one draft forward
    costs).

    Parameters
    ----------
    num_draft : int
        Drafts per step ``K`` (the starting value when ``adaptive``), at most
        :data:`~specdec_kernels.decoding.drafter.MAX_CHAIN_DRAFTS`.
    adaptive : bool
        Grow ``K`` by 2 after a step where every request accepted all its drafts, shrink it
        by 1 otherwise, within ``[min_draft, max_draft]``.
    min_draft, max_draft : int
        Bounds of an adaptive ``K``.
    confidence_threshold : float, optional
        Stop drafting for a request once the draft's top probability falls below this value
        (the uncertain token is not proposed). The loop stops when every request has
        stopped, which reads the device once per drafted token; ``None`` (default) never
        stops early and reads nothing.
    budget : bool
        Let the cost model shorten each step's chain below ``K``, to no drafts at all while
        drafting does not pay (:class:`~specdec_kernels.decoding.budget.ChainBudget`, from
        the target's and the draft's step costs and the measured acceptance). It needs the
        draft's cost: ``draft_cost_curve``, else this machine's, measured against the
        target's on first use and cached
        (:func:`~specdec_kernels.decoding.calibration.machine_draft_cost`); under
        ``SPECDEC_STEP_COST=shipped`` without ``draft_cost_curve`` there is none, and ``K``
        is used as it is.
    cost_curve, draft_cost_curve : str, Path, dict, StepCost, optional
        ``c(T)`` of the target's and the draft's forwards (see
        :meth:`~specdec_kernels.decoding.cost.StepCost.load`); default: this machine's.
    """

    def __init__(
        self,
        num_draft: int = 4,
        *,
        adaptive: bool = False,
        min_draft: int = 1,
        max_draft: int = 8,
        confidence_threshold: float | None = None,
        budget: bool = True,
        cost_curve=None,
        draft_cost_curve=None,
    ):
        for name, value in (("num_draft", num_draft), ("min_draft", min_draft),
                            ("max_draft", max_draft)):
            check_size(name, value, 1, MAX_CHAIN_DRAFTS, CHAIN_LIMIT_REASON)
        if not 1 <= min_draft <= max_draft:
            raise ValueError(f"need 1 <= min_draft <= max_draft, got {min_draft}, {max_draft}")
        if num_draft < 1 or (adaptive and not min_draft <= num_draft <= max_draft):
            raise ValueError(
                f"num_draft must be >= 1 (and within [min_draft, max_draft] when adaptive), "
                f"got {num_draft}"
            )
        if confidence_threshold is not None and not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        self.num_draft = num_draft
        self.adaptive = adaptive
        self.min_draft = min_draft
        self.max_draft = max_draft
        self.confidence_threshold = confidence_threshold
        self.budget = budget
        self.cost_curve = cost_curve
        self.draft_cost_curve = draft_cost_curve
        self._costs = None  # (target, draft) StepCost once known
        self._budgets = None  # ChainBudgets of the run, when the budget is on
        self._depths: list = []
        self._k = num_draft
        self._drafted = 0
        self._vocab = 0
        self._vocab_ids: Tensor | None = None  # target ids of the draft's logits, if not 0..V'

    def bind(self, runner, tokenizer) -> None:
        self._vocab = runner.vocab_size
        self._costs = None  # another target may cost otherwise

    def max_block_width(self) -> int:
        return (self.max_draft if self.adaptive else self.num_draft) + 1

    def describe(self) -> dict:
        return {
            "name": self.name,
            "num_draft": self.num_draft,
            "adaptive": self.adaptive,
            "max_draft": self.max_draft,
            "confidence_threshold": self.confidence_threshold,
            "budget": self.budget,
        }

    def report(self) -> dict:
        return {} if self._budgets is None else {"budget": self._budgets.report()}

    def start(self, state: DecodeState) -> None:
        self._k = self.num_draft
        self._budgets = None
        if self.budget:
            costs = self._step_costs(state.runner)
            if costs is not None:
                self._budgets = ChainBudgets(state.batch, *costs,
                                             first_draft_prior=self.first_draft_prior)

    def select_requests(self, keep: list) -> None:
        if self._budgets is not None:
            self._budgets.select_requests(keep)

    def _step_costs(self, runner) -> tuple | None:
        """``(target, draft)`` step costs for the budget (``None``: the draft's is unknown)."""
        if self._costs is None:
            target = runner.step_cost(self.cost_curve)
            if self.draft_cost_curve is not None:
                draft = StepCost.load(self.draft_cost_curve)
            else:
                ratios = self._draft_cost(runner)
                if ratios is None:
                    return None
                draft = StepCost.by_context(
                    {p: {t: r * target(1, p) for t, r in curve.items()} for p, curve in ratios.items()},
                    source="measured here, against the target")
            self._costs = (target, draft)
        return self._costs

    # ------------------------------------------------------------------ to implement

    def _first_logits(self, state: DecodeState) -> Tensor:
        """``[B, V']`` logits after each request's pending token."""
        raise NotImplementedError

    def _next_logits(self, state: DecodeState, tokens: Tensor, depth: int) -> Tensor:
        """``[B, V']`` logits after draft ``depth`` (``tokens``, ``[B]``), placed at row
        ``starts[b] + depth``."""
        raise NotImplementedError

    def _draft_cost(self, runner) -> dict | None:
        """``{prefix: {T: r}}``: one draft forward over ``T`` rows after ``prefix`` cached
        tokens costs ``r`` target tokens after as many on this machine (``runner`` is the
        target's;
        :func:`~specdec_kernels.decoding.calibration.machine_draft_cost`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ drafting

    def _target_vocab(self, logits: Tensor) -> Tensor:
        """Logits over exactly the target's vocabulary (float32); tokens the draft does not
        score get ``-1e30``."""
        logits = logits.float()
        if self._vocab_ids is not None:  # a head over some tokens only (draft_vocab)
            full = logits.new_full((logits.shape[0], self._vocab), _NEVER)
            return full.index_copy_(1, self._vocab_ids, logits)
        extra = self._vocab - logits.shape[-1]
        if extra > 0:
            logits = torch.nn.functional.pad(logits, (0, extra), value=_NEVER)
        elif extra < 0:
            logits = logits[:, : self._vocab]
        return logits.contiguous()

    def propose(self, state: DecodeState) -> ChainProposal:
        batch = state.batch
        # Requests near their token limit verify fewer drafts, and each request's budget
        # may cut its own chain (so a request's random stream does not depend on its batch).
        caps = [max(0, min(self._k, r - 1)) for r in state.remaining]
        if self._budgets is not None:
            caps = self._budgets.lengths(caps, state.starts)
        k = max(caps)
        if k <= 0:
            self._drafted = 0
            empty = state.pending.new_zeros((batch, 0))
            return ChainProposal(empty, state.pending.new_zeros(batch), [0] * batch)
        want_probs = not state.greedy
        threshold = self.confidence_threshold
        logits = self._target_vocab(self._first_logits(state))
        tokens, probs, confident = [], [], []
        for i in range(k):
            offsets = state.offsets + i
            if want_probs:
                token, q = ops.sample_with_probs(logits, state.draft_params, offsets)
                probs.append(q)
            else:
                token = ops.sample(logits, state.draft_params, offsets)
            tokens.append(token)
            if threshold is not None:
                top = torch.softmax(logits, -1).amax(-1)
                confident.append(top >= threshold)
                if not bool(torch.stack(confident, 1).all(1).any()):  # device read (opt-in)
                    break
            if i + 1 < k:
                logits = self._target_vocab(self._next_logits(state, token, i + 1))
        self._drafted = len(tokens)
        drafts = torch.stack(tokens, 1)
        depths = [min(len(tokens), cap) for cap in caps]
        num_draft = torch.tensor(depths, dtype=torch.int64).to(drafts.device, non_blocking=True)
        if threshold is not None:
            sure = torch.stack(confident, 1).long().cumprod(1).sum(1)
            num_draft = torch.minimum(num_draft, sure)
            depths = num_draft.tolist()
        self._depths = depths
        return ChainProposal(
            drafts, num_draft, depths, torch.stack(probs, 1) if want_probs else None
        )

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        if self._drafted == 0:
            return
        if self._budgets is not None:
            self._budgets.record(self._depths, outcome.num_accepted)
        if not self.adaptive:
            return
        if all(n >= d for n, d in zip(outcome.num_accepted, self._depths)):
            self._k = min(self._k + 2, self.max_draft)
        else:
            self._k = max(self._k - 1, self.min_draft)
