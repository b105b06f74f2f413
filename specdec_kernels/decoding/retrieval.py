"""Retrieval drafting (REST, He et al. 2024): the longest suffix of the context (up to 16
tokens) is looked up in a datastore of token ids built once from a corpus
(:mod:`specdec_kernels.retrieval`); the continuations of its occurrences merge into a trie,
the most frequent first, and the cost-model budget
(:class:`~specdec_kernels.decoding.budget.TreeBudget`) keeps the nodes worth verifying. No
model runs: drafting is a few binary searches in a memory-mapped suffix array."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from specdec_kernels.decoding.budget import (
    AcceptanceStats,
    CandidateTree,
    OutcomeJudge,
    TreeBudget,
    budgeted_trees,
)
from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    DecodeState,
    Drafter,
    StepOutcome,
    TreeProposal,
    check_size,
)

__all__ = ["DEFAULT_DATASTORE", "RetrievalDrafter", "default_datastore_path"]

#: Package folder of the datastore built for the default model (see data/README.md).
DEFAULT_DATASTORE = "datastore/smollm2-135m-instruct"

#: Upper limits of the lookup options (REST itself looks up at most 16 tokens and reads
#: the first matches only).
MAX_SUFFIX_LIMIT, MAX_MATCHES = 256, 4096


def default_datastore_path() -> Path:
    """Folder of the datastore shipped for the default model."""
    return Path(str(resources.files("specdec_kernels.data").joinpath(DEFAULT_DATASTORE)))


def frequency_trie(root: int, continuations: list, max_nodes: int, name: str) -> CandidateTree:
    """The ``max_nodes`` most frequent prefixes of ``continuations`` as a trie rooted at
    ``root``; siblings ranked by frequency (rank 0 the most frequent).

    Parameters
    ----------
    root : int
        The pending token.
    continuations : list of tuple of int
        Token sequences that followed the matched suffix.
    max_nodes : int
        Most nodes kept (root excluded); a prefix is at least as frequent as its extensions,
        so the kept set is a tree.
    name : str
        The prophet recorded on every node.
    """
    counts: dict = {}
    for seq in continuations:
        for d in range(1, len(seq) + 1):
            counts[seq[:d]] = counts.get(seq[:d], 0) + 1
    top = sorted(counts, key=lambda p: (-counts[p], len(p), p))[:max_nodes]
    tree = CandidateTree(root)
    nodes = {(): 0}
    # Parents first (shorter prefixes), siblings by frequency: ranks follow insertion order.
    for prefix in sorted(top, key=lambda p: (len(p), -counts[p], p)):
        parent = nodes.get(prefix[:-1])
        if parent is None:
            continue
        rank = len(tree.children(parent))
        nodes[prefix] = tree.propose(parent, prefix[-1], name, rank)
    return tree


class RetrievalDrafter(Drafter):
    """Drafts trees of the continuations a datastore holds for the context's longest suffix.

    Parameters
    ----------
    datastore : str, Path, Datastore or None
        A datastore folder (``specdec datastore build``) or an opened store; ``None`` for the
        one shipped for the default model.
    max_depth : int
        Longest continuation read.
    max_nodes : int
        Most drafted nodes per tree (before the budget).
    max_suffix, min_suffix : int
        Context suffix lengths tried, longest first; no drafts below ``min_suffix``.
    max_matches : int
        Occurrences read per lookup (evenly spread over all of them).
    cost_curve : optional
        Step-cost curve of the budget (see :class:`~specdec_kernels.decoding.cost.StepCost`).
    budget : bool
        Size each tree with the cost-model budget and this drafter's running acceptance
        (default); ``False`` proposes the ``max_nodes`` most frequent nodes (e.g. when a
        :class:`~specdec_kernels.decoding.multi.MultiDrafter` budgets the merged tree).
    """

    name = "retrieval"
    pausable = True  # reads the contexts at each proposal (see Drafter.pausable)

    def __init__(
        self,
        datastore=None,
        *,
        max_depth: int = 8,
        max_nodes: int = 16,
        max_suffix: int = 16,
        min_suffix: int = 2,
        max_matches: int = 64,
        cost_curve=None,
        budget: bool = True,
    ):
        for name, value in (("max_depth", max_depth), ("max_nodes", max_nodes)):
            check_size(name, value, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        for name, value in (("max_suffix", max_suffix), ("min_suffix", min_suffix)):
            check_size(name, value, 1, MAX_SUFFIX_LIMIT,
                       "each suffix token is one more binary search of the store per step")
        check_size("max_matches", max_matches, 1, MAX_MATCHES,
                   "every occurrence read is merged into the step's trie on the host")
        if min_suffix > max_suffix:
            raise ValueError(f"min_suffix ({min_suffix}) must be <= max_suffix ({max_suffix})")
        from specdec_kernels.retrieval.datastore import Datastore

        # Opened (memory-mapped and checked) now, so a damaged store fails before any model.
        if not isinstance(datastore, Datastore):
            datastore = Datastore(default_datastore_path() if datastore is None else datastore)
        self.datastore = datastore
        self.max_depth, self.max_nodes = max_depth, max_nodes
        self.max_suffix, self.min_suffix, self.max_matches = max_suffix, min_suffix, max_matches
        self.cost_curve = cost_curve
        self.use_budget = budget
        self.store = None
        self.budget: TreeBudget | None = None
        self.stats = AcceptanceStats()
        self._candidates: list = []

    def bind(self, runner, tokenizer) -> None:
        self.datastore.check_tokenizer(tokenizer, vocab_size=runner.vocab_size)
        self.store = self.datastore
        self.budget = TreeBudget(runner.step_cost(self.cost_curve), max_nodes=self.max_nodes)

    def max_block_width(self) -> int:
        return self.max_nodes + 1

    def describe(self) -> dict:
        out = {
            "name": self.name,
            "max_depth": self.max_depth,
            "max_nodes": self.max_nodes,
            "max_suffix": self.max_suffix,
            "min_suffix": self.min_suffix,
            "max_matches": self.max_matches,
            "budget": self.use_budget,
        }
        if self.store is not None:
            out["datastore"] = self.store.describe()
        return out

    def start(self, state: DecodeState) -> None:
        self.stats = AcceptanceStats()
        self._judge = OutcomeJudge(state.batch)

    def candidates(self, state: DecodeState) -> list:
        """Per request, the trie of the most frequent continuations (before the budget)."""
        out = []
        for ctx, left in zip(state.contexts, state.remaining):
            depth = min(self.max_depth, max(left - 1, 0))
            found = self.store.lookup(
                ctx, depth, max_suffix=self.max_suffix, min_suffix=self.min_suffix,
                max_matches=self.max_matches,
            )
            tree = frequency_trie(ctx[-1], found.continuations, self.max_nodes, self.name)
            # Longer matched suffixes predict better: separate statistics per match length.
            tree.labels[self.name] = f"{self.name}:suffix{min(found.suffix_length, 8)}"
            out.append(tree)
        return out

    def propose(self, state: DecodeState) -> TreeProposal:
        candidates = self.candidates(state)
        if self.use_budget:
            tokens, parents, _, depths = budgeted_trees(
                candidates, self.stats, self.budget, state.remaining, state.context_length
            )
        else:
            everything = TreeBudget(self.budget.step_cost, max_nodes=self.max_nodes)
            everything.step_cost = _Free()
            tokens, parents, _, depths = budgeted_trees(
                candidates, AcceptanceStats(default_prior=0.5), everything, state.remaining
            )
        self._candidates = candidates
        device = state.pending.device
        return TreeProposal(
            tokens.to(device, non_blocking=True), parents.to(device, non_blocking=True), depths
        )

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        if self.use_budget:
            self._judge.add(
                state.contexts, outcome.previous_starts, self._candidates, self.stats
            )

    def select_requests(self, keep: list) -> None:
        self._judge.select_requests(keep)

    def report(self) -> dict:
        return {"acceptance_by_depth_rank": self.stats.table()} if self.use_budget else {}


class _Free:
    """A step cost that falls with width: the budget then keeps every candidate node."""

    source = "free"

    def __call__(self, width: float, context: float | None = None) -> float:
        return 1.0 / (1.0 + width)
