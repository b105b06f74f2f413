"""What every drafter sees and returns: the shared decoding state, proposals (a chain or a
tree), the step's outcome, and the :class:`Drafter` base class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

if TYPE_CHECKING:
    from specdec_kernels.decoding.cache import KVCache
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.decoding.step import SamplingParams

__all__ = ["ChainProposal", "DecodeState", "Drafter", "StepOutcome", "TreeProposal"]


@dataclass
class DecodeState:
    """The engine's state for the requests still running (row ``b`` of every field).

    Attributes
    ----------
    runner : ModelRunner
        The target model.
    cache : KVCache
        The target's cache; ``cache.host_lens[b]`` rows are committed.
    contexts : list of list of int
        Prompt and emitted tokens of each request; the last one is the pending token (emitted,
        its K/V not yet in the cache), so ``len(contexts[b]) == cache.host_lens[b] + 1``.
    pending : Tensor
        ``[B]`` int64, the pending tokens on the model's device.
    params : SamplingParams
        Per-request sampling parameters of the target.
    draft_params : SamplingParams
        The same with independent seeds, for drafters that sample.
    offsets : Tensor
        ``[B]`` int64 random-stream offsets of this step (advanced by the engine).
    greedy : bool
        Every request decodes greedily.
    remaining : list of int
        New tokens each request may still emit.
    """

    runner: "ModelRunner"
    cache: "KVCache"
    contexts: list
    pending: Tensor
    params: "SamplingParams"
    draft_params: "SamplingParams"
    offsets: Tensor
    greedy: bool
    remaining: list

    @property
    def batch(self) -> int:
        return len(self.contexts)

    @property
    def starts(self) -> list:
        return self.cache.host_lens


@dataclass
class ChainProposal:
    """``K`` drafted tokens per request, to follow the pending token.

    Attributes
    ----------
    tokens : Tensor
        ``[B, K]`` int64 drafts (columns past ``num_draft[b]`` are ignored).
    num_draft : Tensor
        ``[B]`` int64 valid drafts per request.
    depths : list of int
        The same on the host (for statistics).
    probs : Tensor, optional
        ``[B, K, V]`` float32 distributions the drafts were sampled from (``None``: the
        drafter is deterministic, one-hot q).
    """

    tokens: Tensor
    num_draft: Tensor
    depths: list
    probs: Tensor | None = None

    @property
    def width(self) -> int:
        return self.tokens.shape[1] + 1


@dataclass
class TreeProposal:
    """A tree of drafts per request, rooted at the pending token.

    Attributes
    ----------
    tokens : Tensor
        ``[B, T]`` int64 node tokens; node 0 is the pending token.
    parents : Tensor
        ``[B, T]`` int64 parent of each node (``-1`` for the root, ``-2`` pads ragged trees).
    depths : list of int
        Depth of each request's tree on the host (for statistics).
    probs : Tensor, optional
        ``[B, T, V]`` distribution each node was drafted from (``None``: deterministic).
    """

    tokens: Tensor
    parents: Tensor
    depths: list
    probs: Tensor | None = None

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


@dataclass
class StepOutcome:
    """What verification decided, as the drafters need it.

    Attributes
    ----------
    previous_starts : list of int
        Committed lengths before the step.
    num_accepted : list of int
        Accepted drafts per request (the request also emitted one more token).
    """

    previous_starts: list
    num_accepted: list


class Drafter:
    """Base class of drafters: proposes a chain or a tree of tokens each step.

    Subclasses implement :meth:`propose` and may override the other hooks. A drafter object
    keeps per-run state between :meth:`start` and the end of the run, so one object drives
    one generation at a time.
    """

    #: Short name used in statistics and on the command line.
    name = "drafter"

    def bind(self, runner: "ModelRunner", tokenizer) -> None:
        """Check the drafter can serve this target (raise ``ValueError`` otherwise)."""

    def max_block_width(self) -> int:
        """Largest block (pending token included) :meth:`propose` can return."""
        raise NotImplementedError

    def start(self, state: DecodeState) -> None:
        """Called once after the target's prefill."""

    def propose(self, state: DecodeState) -> ChainProposal | TreeProposal:
        """Drafts for every running request."""
        raise NotImplementedError

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Called after each step, once ``state`` holds the newly emitted tokens."""

    def select_requests(self, keep: list) -> None:
        """Drop every request whose row is not in ``keep``."""

    def describe(self) -> dict:
        """Settings worth reporting next to the statistics."""
        return {"name": self.name}


class NoDrafter(Drafter):
    """Plain autoregressive decoding: no drafts, one token per target forward."""

    name = "autoregressive"

    def max_block_width(self) -> int:
        return 1

    def propose(self, state: DecodeState) -> ChainProposal:
        empty = state.pending.new_zeros((state.batch, 0))
        return ChainProposal(empty, state.pending.new_zeros(state.batch), [0] * state.batch)
