"""Prompt lookup (n-gram) drafting: continue the longest suffix n-gram of the text so far
(prompt and generated tokens) the way it continued where it occurred before. Several
earlier occurrences give several continuations, merged by common prefix into one tree that
the target verifies in a single forward. Drafting is host-side dictionary lookups: no model
runs, and the cost per step is a few microseconds."""

from __future__ import annotations

from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    DecodeState,
    Drafter,
    TreeProposal,
    check_size,
)
from specdec_kernels.tree import stack_trees, tree_from_sequences

__all__ = ["MAX_NGRAM", "NgramIndex", "PromptLookupDrafter"]

#: The longest suffix n-gram indexed: every size up to it costs a dictionary entry per token
#: of every request, and a match this long already picks the continuation.
MAX_NGRAM = 64


class NgramIndex:
    """Where every n-gram (``min_n <= n <= max_n``) of a growing token list occurred.

    ``table[n][g]`` lists, oldest first, every ``i`` such that ``tokens[i - n : i] == g`` and
    ``tokens[i]`` exists (so each entry has a continuation).
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list = []
        self.table = {n: {} for n in range(min_n, max_n + 1)}

    def extend(self, tokens: list) -> None:
        """Index ``tokens`` (the whole list so far; it must extend the one already seen)."""
        old = len(self.tokens)
        self.tokens.extend(tokens[old:])
        for i in range(max(old, 1), len(self.tokens)):
            for n in range(self.min_n, min(self.max_n, i) + 1):
                self.table[n].setdefault(tuple(self.tokens[i - n : i]), []).append(i)

    def longest_match(self) -> int:
        """Length of the longest indexed n-gram that ends the token list and occurred before
        (0 when none did)."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            if self.table[n].get(tuple(self.tokens[size - n :])):
                return n
        return 0

    def continuations(self, depth: int, max_branches: int, max_scan: int = 64) -> list:
        """Up to ``max_branches`` distinct continuations of the current suffix, best first.

        Longer matching n-grams come first, and within one n the most recent occurrence.
        A continuation that is a prefix of one already taken is skipped.

        Returns
        -------
        list of tuple of int
            Each at most ``depth`` tokens long.
        """
        found: list = []
        size = len(self.tokens)
        if depth <= 0:
            return found
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            hits = self.table[n].get(tuple(self.tokens[size - n :]))
            if not hits:
                continue
            for i in reversed(hits[-max_scan:]):
                seq = tuple(self.tokens[i : i + depth])
                if any(s[: len(seq)] == seq for s in found):
                    continue
                found = [s for s in found if seq[: len(s)] != s]  # seq extends s: keep seq
                found.append(seq)
                if len(found) >= max_branches:
                    return found
        return found


class PromptLookupDrafter(Drafter):
    """Drafts trees of continuations of the longest matching suffix n-gram.

    Verifying a block is not free on a CPU (measured here: 4 to 8 tokens cost about 1.6 times
    one token), so drafts are proposed only on evidence: a suffix n-gram of at least
    ``min_ngram`` tokens that occurred before. Long matches (``strong_ngram`` tokens or more,
    typically inside a passage being copied) get deep drafts, shorter ones shallow drafts.

    Parameters
    ----------
    max_ngram, min_ngram : int
        Suffix n-gram sizes tried, longest first; no drafts below ``min_ngram``.
    strong_ngram : int
        Matches at least this long draft ``max_depth`` tokens, shorter ones ``short_depth``.
    max_depth, short_depth : int
        Longest continuation (tree depth) for strong and for short matches.
    max_branches : int
        Continuations (earlier occurrences, most recent first) merged into one tree by common
        prefix; 1 gives a chain.
    max_nodes : int
        Draft nodes per tree (root excluded); lower-priority continuations are trimmed to fit.

    Defaults were chosen by measurement on the default model (see the engine's report):
    exact greedy simulation over dev prompts with the measured cost of verifying ``T`` tokens.
    """

    name = "prompt-lookup"
    pausable = True  # reads the contexts at each proposal (see Drafter.pausable)

    def __init__(
        self,
        *,
        max_ngram: int = 4,
        min_ngram: int = 2,
        strong_ngram: int = 4,
        max_depth: int = 16,
        short_depth: int = 4,
        max_branches: int = 2,
        max_nodes: int = 16,
    ):
        check_size("max_ngram", max_ngram, 1, MAX_NGRAM,
                   f"MAX_NGRAM = {MAX_NGRAM}: each size indexed costs memory per token")
        for name, value in (("max_depth", max_depth), ("short_depth", short_depth),
                            ("max_branches", max_branches), ("max_nodes", max_nodes)):
            check_size(name, value, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if min(max_depth, short_depth, max_branches, max_nodes, strong_ngram) < 1:
            raise ValueError(
                "max_depth, short_depth, strong_ngram, max_branches and max_nodes must be >= 1"
            )
        self.max_ngram, self.min_ngram, self.strong_ngram = max_ngram, min_ngram, strong_ngram
        self.max_depth, self.short_depth = max_depth, min(short_depth, max_depth)
        self.max_branches, self.max_nodes = max_branches, max_nodes
        self._indexes: list = []

    def describe(self) -> dict:
        return {
            "name": self.name,
            "max_ngram": self.max_ngram,
            "min_ngram": self.min_ngram,
            "strong_ngram": self.strong_ngram,
            "max_depth": self.max_depth,
            "short_depth": self.short_depth,
            "max_branches": self.max_branches,
            "max_nodes": self.max_nodes,
        }

    def max_block_width(self) -> int:
        return self.max_nodes + 1

    def start(self, state: DecodeState) -> None:
        self._indexes = [NgramIndex(self.min_ngram, self.max_ngram) for _ in state.contexts]

    def select_requests(self, keep: list) -> None:
        self._indexes = [self._indexes[b] for b in keep]

    def _tree(self, index: NgramIndex, root: int, remaining: int):
        sequences, nodes = [], 0
        match = index.longest_match()
        depth = self.max_depth if match >= self.strong_ngram else self.short_depth
        depth = min(depth, remaining - 1) if match else 0
        for seq in index.continuations(depth, self.max_branches):
            budget = self.max_nodes - nodes
            if budget <= 0:
                break
            added = _new_nodes(sequences, seq)
            if added > budget:
                seq = seq[: len(seq) - (added - budget)]
                added = budget
            sequences.append(seq)
            nodes += added
        depth = max((len(s) for s in sequences), default=0)
        tree = tree_from_sequences(
            sequences, root, max_nodes=self.max_nodes + 1, max_depth=max(depth, 1)
        )
        return tree, depth

    def propose(self, state: DecodeState):
        trees, depths = [], []
        for b, (index, ctx) in enumerate(zip(self._indexes, state.contexts)):
            index.extend(ctx)
            tree, depth = self._tree(index, ctx[-1], state.remaining[b])
            trees.append(tree)
            depths.append(depth)
        tokens, parents = stack_trees(trees)
        device = state.pending.device
        return TreeProposal(
            tokens.to(device, non_blocking=True), parents.to(device, non_blocking=True), depths
        )


def _new_nodes(sequences: list, seq: tuple) -> int:
    """Nodes ``seq`` adds to a prefix tree of ``sequences``."""
    shared = max((_common_prefix(s, seq) for s in sequences), default=0)
    return len(seq) - shared


def _common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

