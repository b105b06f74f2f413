"""Suffix drafting (after SAM-Decoding and SuffixDecoding): the longest suffix of the context
that occurred before, in the request's own text or in a memory of earlier requests' outputs,
and the continuations that followed it there, most frequent first, as a tree.

Each request has a suffix automaton of its context
(:class:`~specdec_kernels.decoding.suffix_automaton.SuffixAutomaton`), grown as tokens are
emitted; its longest earlier match is one lookup. Unlike prompt lookup's n-grams of a few
tokens, the match has any length, and every earlier occurrence counts: the tree holds the
continuations by how often they followed the match, and reaches deeper the longer the match
(a long match is a passage being copied; a short one, a guess). The cost-model budget keeps the
nodes worth verifying, scored by the request's own running acceptance by match length, depth
and rank (:class:`~specdec_kernels.decoding.budget.AcceptanceStats`).

Memory across requests (opt-in)
-------------------------------
A :class:`SuffixMemory` holds the outputs of earlier requests: a drafter given one matches
the context against it too, and adds each request's output when its run ends. **Whatever one
request generated can then shape the drafts of every later request that shares the memory**
(never its output when greedy, nor its output distribution when sampling, but which drafts
are tried, so timing and sampled draws): give one memory to one user's or one task's
requests, never to requests that must not learn of each other. Without a memory nothing is
kept between runs. The memory is bounded (``max_tokens``; least recently used outputs go
first, an output counting as used when drafts from it were accepted) and read-only during a
run, so requests of one batch never see each other's text.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict

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
from specdec_kernels.decoding.suffix_automaton import Matcher, SuffixAutomaton
from specdec_kernels.tree import Tree, stack_trees

__all__ = ["MATCH_PRIORS", "MAX_MEMORY_TOKENS", "SuffixDrafter", "SuffixMemory"]

#: Largest memory: its index costs a few hundred bytes of Python objects per token.
MAX_MEMORY_TOKENS = 1 << 22


class SuffixMemory:
    """Earlier requests' outputs, for the drafts of later requests that share this object.

    Parameters
    ----------
    max_tokens : int
        Most tokens held (at most :data:`MAX_MEMORY_TOKENS`); adding past it drops the least
        recently used outputs (down to three quarters of it, so the index is rebuilt rarely).
        An output longer than the bound keeps its last ``max_tokens`` tokens.

    Attributes
    ----------
    automaton : SuffixAutomaton
        The index of the held outputs (each a document); read it, never grow it directly.
    """

    def __init__(self, max_tokens: int = 65536):
        self.max_tokens = check_size(
            "max_tokens", max_tokens, 1, MAX_MEMORY_TOKENS,
            f"MAX_MEMORY_TOKENS = {MAX_MEMORY_TOKENS}: the index costs a few hundred bytes of "
            "Python objects per token")
        self.clear()

    def clear(self) -> None:
        """Forget everything."""
        self._documents: OrderedDict = OrderedDict()  # id -> tokens, least recently used first
        self._next_id = 0
        self.num_tokens = 0
        self._rebuild()

    @property
    def num_documents(self) -> int:
        return len(self._documents)

    def add(self, tokens) -> None:
        """Hold one more output (most recently used)."""
        tokens = tuple(int(t) for t in tokens)[-self.max_tokens :]
        if not tokens:
            return
        self._documents[self._next_id] = tokens
        self._next_id += 1
        self.num_tokens += len(tokens)
        if self.num_tokens <= self.max_tokens:
            self._index(self._next_id - 1, tokens)
            return
        while self.num_tokens > self.max_tokens * 3 // 4 and len(self._documents) > 1:
            _, dropped = self._documents.popitem(last=False)
            self.num_tokens -= len(dropped)
        self._rebuild()

    def touch(self, position: int) -> None:
        """Mark the output holding token ``position`` of the automaton as just used."""
        at = bisect.bisect_right(self._starts, position) - 1
        if at >= 0 and self._ids[at] in self._documents:
            self._documents.move_to_end(self._ids[at])

    def _rebuild(self) -> None:
        self.automaton = SuffixAutomaton()
        self._starts, self._ids = [], []
        for doc_id, tokens in self._documents.items():
            self._index(doc_id, tokens)

    def _index(self, doc_id: int, tokens: tuple) -> None:
        self._starts.append(len(self.automaton.tokens))
        self._ids.append(doc_id)
        self.automaton.start_document()
        self.automaton.extend(tokens)

    def describe(self) -> dict:
        return {"max_tokens": self.max_tokens, "tokens": self.num_tokens,
                "documents": self.num_documents}


#: P(the first draft after a match holds) by the match's length class, before a request has
#: evidence of its own: measured with the default model on generic requests and on requests
#: built around its answers (summaries, translations, passages: never the benchmark prompts;
#: ``python3 -m bench.prophet_tuning``, see bench/RESULTS.md), capped at 0.95. A long match
#: is a passage being copied.
MATCH_PRIORS = {"1": 0.22, "2": 0.57, "3-4": 0.58, "5-8": 0.79, "9-16": 0.95, "17+": 0.95}


def match_class(length: int) -> str:
    """Bucket of a match length for the statistics: ``"1"``, ``"2"``, ``"3-4"``, ``"5-8"``,
    ``"9-16"`` or ``"17+"``."""
    for bound, label in ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (16, "9-16")):
        if length <= bound:
            return label
    return "17+"


class SuffixDrafter(Drafter):
    """Drafts the most frequent continuations of the context's longest earlier match.

    Parameters
    ----------
    memory : SuffixMemory, optional
        Earlier requests' outputs to match against as well, and to add this run's outputs
        to (opt-in: see the module notes). ``None``: each request's own context only.
    max_depth : int
        Deepest draft.
    depth_per_match : float
        A match of ``m`` tokens drafts at most ``ceil(depth_per_match * m)`` deep.
    min_match : int
        No drafts from matches shorter than this.
    max_nodes : int
        Most drafted nodes per tree (before the budget).
    max_branches : int
        Most continuations looked at after each node.
    cost_curve : optional
        Step-cost curve of the budget (see :class:`~specdec_kernels.decoding.cost.StepCost`).
    budget : bool
        Size each request's tree with the cost model and its running acceptance (default);
        ``False`` proposes the ``max_nodes`` most frequent nodes (e.g. when a
        :class:`~specdec_kernels.decoding.multi.MultiDrafter` budgets the merged tree).

    Raises
    ------
    ValueError
        Sizes that are not integers, below 1 or above the block limit
        (``drafter.MAX_BLOCK_WIDTH``), ``depth_per_match`` not a positive number, or a
        ``memory`` that is not a :class:`SuffixMemory`.
    """

    name = "suffix"
    pausable = True  # reads the contexts at each proposal (see Drafter.pausable)

    def __init__(self, *, memory: SuffixMemory | None = None, max_depth: int = 16,
                 depth_per_match: float = 3.0, min_match: int = 1, max_nodes: int = 16,
                 max_branches: int = 3, cost_curve=None, budget: bool = True):
        for name, value in (("max_depth", max_depth), ("max_nodes", max_nodes),
                            ("max_branches", max_branches)):
            check_size(name, value, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        check_size("min_match", min_match, 1, MAX_MEMORY_TOKENS)
        if not 0 < depth_per_match < math.inf:
            raise ValueError(f"depth_per_match must be a number > 0, got {depth_per_match!r}")
        if memory is not None and not isinstance(memory, SuffixMemory):
            raise ValueError(f"memory must be a SuffixMemory or None, got {type(memory).__name__}")
        self.memory = memory
        self.max_depth, self.depth_per_match, self.min_match = max_depth, depth_per_match, min_match
        self.max_nodes, self.max_branches = max_nodes, max_branches
        self.cost_curve = cost_curve
        self.use_budget = budget
        self.budget: TreeBudget | None = None
        self._requests: list = []
        self._candidates: list = []
        self._stats: list = []
        self._judge = OutcomeJudge(0)
        self._counts: dict = {}
        self._outputs: list = []

    def bind(self, runner, tokenizer) -> None:
        self.budget = TreeBudget(runner.step_cost(self.cost_curve), max_nodes=self.max_nodes)

    def max_block_width(self) -> int:
        return self.max_nodes + 1

    def describe(self) -> dict:
        out = {"name": self.name, "max_depth": self.max_depth,
               "depth_per_match": self.depth_per_match, "min_match": self.min_match,
               "max_nodes": self.max_nodes, "max_branches": self.max_branches,
               "budget": self.use_budget}
        if self.memory is not None:
            out["memory"] = self.memory.describe()
        return out

    def start(self, state: DecodeState) -> None:
        self._requests = [_Request(ctx, self.memory) for ctx in state.contexts]
        self._outputs = [(ctx, len(ctx)) for ctx in state.contexts]  # filled in by the engine
        priors = {f"{self.name}:{source}{match}": p for match, p in MATCH_PRIORS.items()
                  for source in ("context", "memory")}
        self._stats = [AcceptanceStats(priors=priors) for _ in state.contexts]
        self._judge = OutcomeJudge(state.batch)
        self._counts = {"steps": 0, "context_matches": 0, "memory_matches": 0,
                        "accepted_from_context": 0, "accepted_from_memory": 0}

    def _depth(self, match: int, remaining: int) -> int:
        """How deep a match of ``match`` tokens drafts (0: no drafts)."""
        if match < self.min_match:
            return 0
        return max(min(self.max_depth, math.ceil(self.depth_per_match * match), remaining - 1), 0)

    def candidates(self, state: DecodeState) -> list:
        """Per request, the trie of the likeliest continuations (before the budget)."""
        out = []
        for request, ctx, left in zip(self._requests, state.contexts, state.remaining):
            request.extend(ctx)
            cand = CandidateTree(ctx[-1])
            request.memory_nodes, request.probs = {}, {0: 1.0}
            for source, (automaton, match_state, length) in request.matches().items():
                depth = self._depth(length, left)
                if depth < 1:
                    continue
                self._counts[f"{source}_matches"] += 1
                found = automaton.continuations(match_state, self.max_nodes, depth,
                                                self.max_branches)
                where = []
                for parent, token, rank, node_state, prob in zip(
                        found.parents, found.tokens, found.ranks, found.states, found.probs):
                    node = cand.propose(where[parent] if parent >= 0 else 0, token, source, rank)
                    where.append(node)
                    request.probs[node] = max(prob, request.probs.get(node, 0.0))
                    if source == "memory":
                        request.memory_nodes[node] = automaton.last_end[node_state]
                cand.labels[source] = f"{self.name}:{source}{match_class(length)}"
            out.append(cand)
        self._counts["steps"] += len(out)
        return out

    def propose(self, state: DecodeState) -> TreeProposal:
        candidates = self.candidates(state)
        if self.use_budget:
            trees = [_as_tree(cand, budgeted_trees([cand], stats, self.budget, [left], context)[2][0])
                     for cand, stats, left, context in zip(candidates, self._stats,
                                                           state.remaining, state.starts)]
        else:
            trees = [_as_tree(cand, _likeliest(request.probs, cand, self.max_nodes))
                     for cand, request in zip(candidates, self._requests)]
        self._candidates = candidates
        tokens, parents = stack_trees(trees)
        device = state.pending.device
        return TreeProposal(tokens.to(device, non_blocking=True),
                            parents.to(device, non_blocking=True),
                            [max(t.depths) for t in trees])

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        for b, (cand, request) in enumerate(zip(self._candidates, self._requests)):
            n = outcome.num_accepted[b]
            start = outcome.previous_starts[b] + 1
            for node in cand.follow(state.contexts[b][start : start + n]):
                sources = cand.sources[node]
                for source in sources:
                    self._counts[f"accepted_from_{source}"] += 1
                if node in request.memory_nodes:
                    self.memory.touch(request.memory_nodes[node])
        self._judge.add(state.contexts, outcome.previous_starts, self._candidates, self._stats)

    def select_requests(self, keep: list) -> None:
        self._requests = [self._requests[b] for b in keep]
        self._stats = [self._stats[b] for b in keep]
        self._judge.select_requests(keep)

    def finish(self) -> None:
        """Add every request's output to the memory (in request order), if there is one."""
        if self.memory is not None:
            for ctx, prompt_length in self._outputs:
                self.memory.add(ctx[prompt_length:])
        self._outputs = []

    def report(self) -> dict:
        out = dict(self._counts)
        if self.memory is not None:
            out["memory"] = self.memory.describe()
        return out


class _Request:
    """One request's automaton of its context, and its matcher against the memory."""

    def __init__(self, context: list, memory: SuffixMemory | None):
        self.automaton = SuffixAutomaton()
        self.memory = memory
        self.matcher = Matcher(memory.automaton) if memory is not None else None
        self.seen = 0
        self.memory_nodes: dict = {}  # trie node -> its position in the memory
        self.probs: dict = {}  # trie node -> path probability by frequency
        self.extend(context)

    def extend(self, context: list) -> None:
        new = context[self.seen :]
        self.automaton.extend(new)
        if self.matcher is not None:
            self.matcher.extend(new)
        self.seen = len(context)

    def matches(self) -> dict:
        """``{source: (automaton, state, length)}`` of the context's longest earlier match
        in its own text and in the memory."""
        state, length = self.automaton.repeated_suffix()
        out = {"context": (self.automaton, state, length)}
        if self.matcher is not None:
            out["memory"] = (self.memory.automaton, self.matcher.state, self.matcher.length)
        return out


def _likeliest(probs: dict, cand: CandidateTree, max_nodes: int) -> list:
    """The root and the ``max_nodes`` nodes of highest path probability (a node is never
    likelier than its parent, and ties go to the shallower: a tree), in index order."""
    order = sorted(probs, key=lambda n: (-probs[n], cand.depths[n], n))
    return sorted(order[: max_nodes + 1])


def _as_tree(cand: CandidateTree, kept: list) -> Tree:
    """The kept trie nodes (the root first, parents before children) as a tree."""
    index = {node: i for i, node in enumerate(kept)}
    return Tree(parents=[-1] + [index[cand.parents[n]] for n in kept[1:]],
                tokens=[cand.tokens[n] for n in kept])
