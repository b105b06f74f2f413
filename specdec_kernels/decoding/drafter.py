"""What every drafter sees and returns: the shared decoding state, proposals (a chain or a
tree, each with its acceptance rule), the step's outcome, and the :class:`Drafter` base class.

The step's doorways
-------------------
Every method is one drafter over one step: :meth:`Drafter.propose` -> one target forward ->
verification -> KV commit -> :meth:`Drafter.accept`. What a drafter needs from the step comes
through general doorways, never through a branch on the method:

**Blocks that are not trees** (lookahead, Jacobi and alike). A proposal may carry
:class:`ExtraRows`: rows run in the same forward as the verified chain or tree, each with its
own token, its own position (an offset from the pending token's) and its own attention pattern
(a bit-packed mask over the whole block: the ``T`` chain/tree nodes, then the ``R`` extra
rows), never verified and never committed. The engine builds the block
``[tree nodes | extra rows]``: the tree rows get their usual ancestor mask over the tree alone
(so their logits, and verification, are exactly what the tree alone would give, whatever the
extra rows hold), the extra rows get the drafter's mask and positions; both attention paths
take it (Hugging Face 4-D masks with ``position_ids``, or the tree-attention kernel through the
packed mask). The KV op then commits only the accepted path: the extra rows' K/V is dropped
like a rejected draft's. :attr:`StepOutcome.logits` hands the drafter the logits of the
whole block from that same forward (``[:, T:]`` are the extra rows'), with
:attr:`StepOutcome.tree_width` ``= T``. :func:`specdec_kernels.ops.build_lookahead_masks`
builds the rows of a lookahead window; any other pattern can be packed with
:func:`specdec_kernels.tree.pack_tree_mask`.

**Target features** (:attr:`Drafter.target_features`). A drafter that sets it is handed
hidden states of the target at the capture points it names, for every request's *accepted
rows*, taken from the verification forward itself: no second forward, no extra device read,
no change to the model (forward hooks on the capture points, installed for the duration of
the engine's own forwards). It is a :class:`~specdec_kernels.decoding.runner.FeatureSpec`, or
its shorthand: ``"final_norm"`` (the final norm's output, the LM head's input: Medusa-style
heads) or a tuple of points such as ``(2, 15, 27)`` (decoder layers' outputs, concatenated:
EAGLE-3's low, middle and high features). After the prefill the rows are the prompt's last
prefilled row (whose logits predict the pending token), or every prefilled row when the spec
says ``prompt_rows="all"`` (a drafter that keeps its own KV cache over the target's features
prefills from them); after each step they are the accepted path, pending token first. They
sit in :attr:`DecodeState.features` (``[B, R, W]``, ``W`` = points x hidden size) with
:attr:`DecodeState.feature_counts` (``[B]``, valid rows per request); row ``j`` of a request
belongs to the token at position ``starts_before + j`` of its context (its logits predict the
token after it). :meth:`DecodeState.last_features` gives the row whose logits produced each
request's pending token. Drafters that do not ask pay nothing. Prophets of the merged drafter
(:class:`~specdec_kernels.decoding.multi.MultiDrafter`) may ask for different points: the
engine captures their union once, and each prophet is handed its own points' columns.

**Acceptance rule** (:attr:`Proposal.acceptance`). A proposal is a block, the same for chains
and trees (:meth:`Proposal.block`: the tokens, pending token first, and their parents, ``-2`` on
rows that are not verified), plus the rule that decides which drafts hold, from
:mod:`~specdec_kernels.decoding.acceptance`:

- ``LOSSLESS`` (the default): the target's greedy output, or exactly its distribution;
- ``Typical(posterior_threshold, posterior_alpha)``: Medusa's typical acceptance, lossy when
  sampling (draft distributions unused);
- ``GREEDY``: the target's argmax whatever a request's temperature, lossy when sampling.

The engine hands the target's logits over the block to :meth:`Proposal.verify`, which calls
the rule for its shape (chain or tree); the rule makes the op call and answers with a
``Verdict`` (the accepted path's block rows, the emitted tokens, the accepted count) that the
engine commits the same way whatever the rule and the shape. A new rule is a subclass of
``AcceptanceRule`` with a method per shape.

**A cost model** (:mod:`~specdec_kernels.decoding.cost`, :mod:`~specdec_kernels.decoding.budget`).
The device's measured step cost ``c(T)`` (:class:`~specdec_kernels.decoding.cost.StepCost`,
from ``runner.step_cost(curve)`` in :meth:`Drafter.bind`: the caller's curve, else this
machine's for this model, measured on first use and cached,
:mod:`~specdec_kernels.decoding.calibration`) and running acceptance statistics by prophet, depth and rank
(:class:`~specdec_kernels.decoding.budget.AcceptanceStats`) let a drafter size its tree each
step: :class:`~specdec_kernels.decoding.budget.TreeBudget` keeps the nodes that maximise
expected tokens per unit of step cost (retrieval and merged prophets use it each step; Medusa's
static tree is the same budget applied once to its rank-path tree).
:class:`~specdec_kernels.decoding.budget.ChainBudget` sizes a chain the same way, weighing
also the draft's own forwards (their cost measured as a ratio to a target token,
:func:`~specdec_kernels.decoding.calibration.machine_draft_cost`), down to no drafts while
drafting does not pay, one budget per request
(:class:`~specdec_kernels.decoding.budget.ChainBudgets`): every
:class:`~specdec_kernels.decoding.chain_drafter.AutoregressiveDrafter` uses it (a new chain
drafter only says what its draft forward is, ``_draft_cost``), and Jacobi's and blockwise
decoding's guesses with no draft cost at all. The cost of a step grows with the context its
attention reads, so every choice is made at the step's: ``state.context_length`` (the batch's
mean, for a block the batch shares) or ``state.starts`` (per request, for a
request's own budget), passed to ``TreeBudget.choose``, ``budgeted_trees``, ``choose_tree``
and ``ChainBudgets.lengths``; a choice kept between steps is made again when the context has
moved by :data:`~specdec_kernels.decoding.budget.CONTEXT_STEP` rows.

**A drafter's own network** (``runner.linears(module)``, a factory of contexts). A drafter that
runs a network of its own (EAGLE's draft layer) gets the factory once in :meth:`Drafter.bind`
and runs the network inside ``factory()`` to get the target's CPU linear kernels (the package's
small-batch kernel where the kernel choice picked it), instead of torch's GEMM, which packs the
weight on every call of a few rows.

**What the forward predicted** (:attr:`StepOutcome.logits`, :attr:`StepOutcome.tokens`,
:attr:`StepOutcome.parents`, :attr:`StepOutcome.accepted_rows`). After every step a drafter
is handed, on the device and without any extra device read, the target's logits over every
row of the verified block, the token each row held (``-1`` on rows a request did not use),
its parent row, and which rows formed the accepted path: the top-k of every row, rejected
branches included, is free evidence of what follows which tokens (token recycling keeps it).
A merged prophet gets the merged block's.

**Drafter statistics** (:meth:`Drafter.report`). Whatever a drafter measured about itself
(e.g. per-prophet figures of a merged drafter) is returned by :meth:`Drafter.report` at the end
of a run and lands in :attr:`~specdec_kernels.decoding.stats.RunStats.drafter_report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specdec_kernels.decoding.acceptance import LOSSLESS, AcceptanceRule, Verdict
from specdec_kernels.tree import PAD_PARENT

if TYPE_CHECKING:
    from specdec_kernels.decoding.cache import KVCache
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.sampling import SamplingParams

__all__ = [
    "MAX_BLOCK_WIDTH",
    "MAX_CHAIN_DRAFTS",
    "ChainProposal",
    "DecodeState",
    "Drafter",
    "ExtraRows",
    "Proposal",
    "StepOutcome",
    "TreeProposal",
    "check_size",
]

#: The widest block (pending token included) one verification forward may hold, whatever
#: the drafter. Verifying is one target forward over the block, and past a few dozen tokens
#: its cost grows with the width (the shipped CPU curve: 128 tokens cost 5.8 one-token steps),
#: while the published methods verify at most ~120 per step (Medusa 64 nodes, EAGLE-2 60,
#: lookahead's 7B GPU setting 120). Checked before anything is allocated.
MAX_BLOCK_WIDTH = 256

#: The most tokens a chain drafter that runs a model per token (a draft model, the target's
#: first layers, its int8 copy) drafts in one step: each is a forward, and all K are
#: accepted with probability a**K; at K = 64 even a draft that agrees 95% of the time gets
#: its whole chain accepted 4% of the time.
MAX_CHAIN_DRAFTS = 64


def check_size(name: str, value, low: int, high: int, why: str = "") -> int:
    """``value`` when it is an int in ``[low, high]``; otherwise a ``ValueError`` that names
    ``name``, the limits and, for the upper one, ``why``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}" + (f" ({why})" if why else ""))
    return value


#: The reason given when a drafter's options make its block wider than MAX_BLOCK_WIDTH.
BLOCK_LIMIT_REASON = (
    f"a verification block holds at most MAX_BLOCK_WIDTH = {MAX_BLOCK_WIDTH} tokens: past a "
    "few dozen, verifying costs more than the drafts can save"
)
CHAIN_LIMIT_REASON = (
    f"MAX_CHAIN_DRAFTS = {MAX_CHAIN_DRAFTS}: every draft token is one draft forward per step "
    "and a long chain is almost never accepted whole"
)


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
    features : Tensor, optional
        ``[B, R, W]`` target features of the rows accepted by the last forward (the prefill's
        last row or all its rows, or a step's accepted path, pending token first); only for
        drafters that set :attr:`Drafter.target_features`. Rows ``>= feature_counts[b]`` are
        meaningless. A request whose prompt had a single token (nothing prefilled) starts
        with zeros (one row, or none with ``prompt_rows="all"``).
    feature_counts : Tensor, optional
        ``[B]`` int64 valid rows of ``features`` per request (on the device).
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
    features: Tensor | None = None
    feature_counts: Tensor | None = None

    @property
    def batch(self) -> int:
        return len(self.contexts)

    def last_features(self) -> Tensor:
        """``[B, H]`` features of each request's last accepted row: the row whose logits
        gave its pending token (no device read)."""
        if self.features is None:
            raise ValueError("no target features: the drafter must set target_features")
        index = (self.feature_counts - 1).clamp(min=0)
        hidden = self.features.shape[-1]
        return self.features.gather(1, index.view(-1, 1, 1).expand(-1, 1, hidden)).squeeze(1)

    @property
    def starts(self) -> list:
        """Committed rows of each request: where the step's block starts, and the context its
        attention reads besides the block (a step's cost grows with it,
        :class:`~specdec_kernels.decoding.cost.StepCost`)."""
        return self.cache.host_lens

    @property
    def context_length(self) -> float:
        """The batch's mean :attr:`starts`: the context at which a block the batch shares is
        costed (its attention reads ``sum(starts)`` keys per block row)."""
        lengths = self.cache.host_lens
        return sum(lengths) / max(len(lengths), 1)


@dataclass
class ExtraRows:
    """Rows run in the verification forward but never verified or committed (see the module
    notes). ``T`` is the width of the proposal they ride on (``K + 1`` for a chain, the tree's
    node count), ``R`` the number of extra rows.

    Attributes
    ----------
    tokens : Tensor
        ``[B, R]`` int64 token of each row.
    positions : Tensor
        ``[B, R]`` int64 position of each row after the pending token's (the root's, 0);
        ``-1`` marks a padding row (ragged batches), which is run at the root's position and
        must attend only to itself.
    mask : Tensor
        ``[B, R, ceil((T + R) / 32)]`` int32 bit-packed attention of each row over the block
        (bit ``k % 32`` of word ``k // 32``: column ``k < T`` is chain/tree node ``k``, column
        ``T + j`` is extra row ``j``); the committed prefix is always visible. Rows may attend
        to tree nodes and to each other; tree nodes never attend to extra rows.
    """

    tokens: Tensor
    positions: Tensor
    mask: Tensor

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[1]


class Proposal:
    """What :meth:`Drafter.propose` returns: a block of drafts rooted at each request's pending
    token, as a chain (:class:`ChainProposal`) or a tree (:class:`TreeProposal`), with the rule
    that verifies it (see the module notes).

    Attributes
    ----------
    depths : list of int
        Depth of each request's drafts on the host (for statistics).
    probs : Tensor, optional
        The distributions the drafts were sampled from (``None``: deterministic, one-hot q).
    extra : ExtraRows, optional
        Rows run in the same forward after the block, never verified.
    acceptance : AcceptanceRule
        How the target's logits decide which drafts hold (``LOSSLESS`` by default).
    """

    def block(self, pending: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, T]`` int64 tokens (node 0: the pending token) and parents (``-1`` at the root,
        ``-2`` on rows that are not verified) of the block the target runs."""
        raise NotImplementedError

    def verify(self, logits: Tensor, params: "SamplingParams", offsets: Tensor) -> Verdict:
        """The acceptance rule's verdict from the target's ``[B, T, V]`` logits over the block
        (row ``j`` predicts the token after block row ``j``)."""
        raise NotImplementedError


@dataclass
class ChainProposal(Proposal):
    """``K`` drafted tokens per request, to follow the pending token.

    Attributes
    ----------
    tokens : Tensor
        ``[B, K]`` int64 drafts (columns past ``num_draft[b]`` are run but not verified).
    num_draft : Tensor
        ``[B]`` int64 valid drafts per request.
    depths : list of int
        The same on the host (for statistics).
    probs : Tensor, optional
        ``[B, K, V]`` float32 distributions the drafts were sampled from (``None``: the
        drafter is deterministic, one-hot q).
    extra : ExtraRows, optional
        Rows run in the same forward after the chain's ``K + 1``, never verified.
    acceptance : AcceptanceRule
        See :class:`Proposal`.
    """

    tokens: Tensor
    num_draft: Tensor
    depths: list
    probs: Tensor | None = None
    extra: ExtraRows | None = None
    acceptance: AcceptanceRule = LOSSLESS

    @property
    def width(self) -> int:
        return self.tokens.shape[1] + 1

    def block(self, pending: Tensor) -> tuple[Tensor, Tensor]:
        tokens = torch.cat([pending[:, None], self.tokens], 1)
        rows = torch.arange(tokens.shape[1], device=tokens.device)
        parents = torch.where(rows[None, :] <= self.num_draft[:, None], rows - 1, PAD_PARENT)
        return tokens, parents

    def verify(self, logits: Tensor, params: "SamplingParams", offsets: Tensor) -> Verdict:
        return self.acceptance.verify_chain(
            self.tokens, self.num_draft, logits, self.probs, params, offsets
        )


@dataclass
class TreeProposal(Proposal):
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
    extra : ExtraRows, optional
        Rows run in the same forward after the tree's ``T`` nodes, never verified.
    acceptance : AcceptanceRule
        See :class:`Proposal`.
    """

    tokens: Tensor
    parents: Tensor
    depths: list
    probs: Tensor | None = None
    extra: ExtraRows | None = None
    acceptance: AcceptanceRule = LOSSLESS

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def block(self, pending: Tensor) -> tuple[Tensor, Tensor]:
        return self.tokens, self.parents

    def verify(self, logits: Tensor, params: "SamplingParams", offsets: Tensor) -> Verdict:
        return self.acceptance.verify_tree(
            self.tokens, self.parents, logits, self.probs, params, offsets
        )


@dataclass
class StepOutcome:
    """What verification decided, as the drafters need it.

    Attributes
    ----------
    previous_starts : list of int
        Committed lengths before the step.
    num_accepted : list of int
        Accepted drafts per request (the request also emitted one more token).
    logits : Tensor, optional
        ``[B, T + R, V]`` the target's logits over the whole block of the step, from its one
        forward: the chain's ``K + 1`` or the tree's ``T`` nodes, then the proposal's
        :class:`ExtraRows` (if any). Row ``j`` predicts the token after block row ``j``.
    tree_width : int
        ``T``: block rows that were verified (extra rows start there).
    tokens : Tensor, optional
        ``[B, T]`` int64 token of each verified block row (the pending token first; ``-1`` on
        rows a request did not use: tree padding, chain columns past its ``num_draft``), on
        the device: with :attr:`logits`, what the target predicted after which token.
    parents : Tensor, optional
        ``[B, T]`` int64 parent row of each verified block row (``-1`` the root, ``-2``
        unused; a chain's row ``j`` has parent ``j - 1``), on the device.
    accepted_rows : Tensor, optional
        ``[B, W]`` int64 block rows of each request's accepted path, the pending token's
        (row 0) first, then ``-1`` past its ``num_accepted[b] + 1`` entries, on the device.
    """

    previous_starts: list
    num_accepted: list
    logits: Tensor | None = None
    tree_width: int = 0
    tokens: Tensor | None = None
    parents: Tensor | None = None
    accepted_rows: Tensor | None = None

    @property
    def extra_logits(self) -> Tensor | None:
        """``[B, R, V]`` logits of the proposal's extra rows (``None`` without a forward)."""
        return None if self.logits is None else self.logits[:, self.tree_width :]


class Drafter:
    """Base class of drafters: proposes a chain or a tree of tokens each step.

    Subclasses implement :meth:`propose` and may override the other hooks. A drafter object
    keeps per-run state between :meth:`start` and the end of the run, so one object drives
    one generation at a time.
    """

    #: Short name used in statistics and on the command line.
    name = "drafter"

    #: P(its first draft is accepted) before any evidence, for a budget that merges its
    #: proposals (:class:`~specdec_kernels.decoding.multi.MultiDrafter`) or sizes its chain
    #: (:class:`~specdec_kernels.decoding.budget.ChainBudget`); ``None`` (default): judged by
    #: how deep it drafted (``budget.CLASS_PRIORS``), for drafters that draft deep only when
    #: they are sure, and ``budget.CHAIN_PRIOR`` for a chain.
    first_draft_prior: float | None = None

    #: Whether a merging drafter (:class:`~specdec_kernels.decoding.multi.MultiDrafter`) may
    #: skip this drafter's :meth:`propose` and :meth:`accept` together for any number of steps
    #: (it pauses a prophet whose accepted drafts are worth less than its proposing time):
    #: true for drafters that read what they need from ``DecodeState.contexts`` at each
    #: proposal and keep no state that one step's ``accept`` must follow up (a draft model's
    #: KV cache does). Default False.
    pausable = False

    #: Target features the drafter reads (see the module's doorways): ``None`` (default,
    #: nothing is captured), ``"final_norm"`` (the final norm's output of accepted rows, in
    #: :attr:`DecodeState.features`), a tuple of capture points (decoder-layer indices and
    #: ``"final_norm"``) or a :class:`~specdec_kernels.decoding.runner.FeatureSpec`.
    target_features = None

    @classmethod
    def from_options(cls, options, context) -> "Drafter":
        """The drafter :func:`~specdec_kernels.decoding.make_drafter` builds from its registry
        entry (:mod:`specdec_kernels.drafters`): ``options`` is the entry's options dataclass,
        ``context`` a :class:`~specdec_kernels.decoding.factory.DrafterContext` (the draft
        model). By default the options are the constructor's keyword arguments; override when
        they are not."""
        from specdec_kernels.drafters import option_values

        return cls(**option_values(options))

    def bind(self, runner: "ModelRunner", tokenizer) -> None:
        """Check the drafter can serve this target (raise ``ValueError`` otherwise)."""

    def max_block_width(self) -> int:
        """Largest block (pending token included) :meth:`propose` can return."""
        raise NotImplementedError

    def start(self, state: DecodeState) -> None:
        """Called once after the target's prefill."""

    def propose(self, state: DecodeState) -> Proposal:
        """Drafts for every running request."""
        raise NotImplementedError

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Called after each step, once ``state`` holds the newly emitted tokens."""

    def select_requests(self, keep: list) -> None:
        """Drop every request whose row is not in ``keep``."""

    def finish(self) -> None:
        """Called once when the run ends (e.g. to release a draft model's runner)."""

    def report(self) -> dict:
        """Figures the drafter measured about itself during the run (called before
        :meth:`finish`; stored in ``RunStats.drafter_report``). Empty by default."""
        return {}

    def describe(self) -> dict:
        """Settings worth reporting next to the statistics (asked at the start of a run and
        again at its end, where a setting may be stated from what the run measured)."""
        return {"name": self.name}


class NoDrafter(Drafter):
    """Plain autoregressive decoding: no drafts, one token per target forward."""

    name = "autoregressive"

    def max_block_width(self) -> int:
        return 1

    def propose(self, state: DecodeState) -> ChainProposal:
        empty = state.pending.new_zeros((state.batch, 0))
        return ChainProposal(empty, state.pending.new_zeros(state.batch), [0] * state.batch)
