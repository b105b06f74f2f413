"""Several prophets at once: every drafter proposes, the proposals merge into one trie per
request, a cost-model budget keeps the nodes worth verifying, the target verifies the tree
once, and every prophet is told what was accepted.

Merging
-------
Each prophet's chain or tree is inserted into a trie rooted at the pending token: a node is
``(parent, token)``, so the same continuation proposed twice (by two prophets, or twice by
one) is one node, which remembers every prophet that proposed it and at which *rank* (its
order among that prophet's children of the same parent).

The lossless rule
-----------------
The merged tree is verified with **one-hot drafts** (``probs=None``) through the SpecInfer
tree rule (:func:`~specdec_kernels.ops.verify_tree`): a node's token is treated as a fixed
proposal, accepted with the target's (residual) probability of that token, siblings tried in
turn with the residual. This is exact whatever produced the tokens, sampled drafts included,
as long as they do not depend on the verification's random stream (prophets draw from
``DecodeState.draft_params``, an independent stream). A prophet's own draft distribution
``q`` is not used: once two prophets propose the same token, or one prophet's sampled node
is deduplicated against another's, that node's token no longer has the distribution ``q``,
and verifying it with ``q`` would bias the output. (A prophet alone keeps its own ``q``:
use it directly instead of through :class:`MultiDrafter`.)

What the prophets are told
--------------------------
After the step, prophet ``p`` receives a :class:`StepOutcome` whose ``num_accepted[b]`` is the
number of leading accepted drafts that it had proposed itself (its chain's matching prefix,
whether or not the budget kept its whole proposal), without logits. Drafters whose proposals
carry :class:`~specdec_kernels.decoding.drafter.ExtraRows` or ask for typical acceptance
cannot be merged (``ValueError``).

Statistics per prophet (in the run's ``drafter_report``): nodes proposed, nodes verified
(kept by the budget), accepted drafts it had proposed, and their share of the emitted tokens.
"""

from __future__ import annotations

from specdec_kernels.decoding.budget import AcceptanceStats, TreeBudget, path_probabilities
from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    ChainProposal,
    DecodeState,
    Drafter,
    StepOutcome,
    TreeProposal,
    check_size,
)
from specdec_kernels.tree import Tree, stack_trees

__all__ = ["CandidateTree", "MultiDrafter", "OutcomeJudge", "budgeted_trees", "judge"]


class CandidateTree:
    """A trie of drafts rooted at a request's pending token, with each node's prophets.

    Attributes
    ----------
    tokens, parents, depths : list of int
        Per node (node 0 the root: the pending token, parent ``-1``, depth 0).
    sources : list of dict
        Per node ``{prophet: rank}``.
    labels : dict
        ``{prophet: statistics key}``: under which key of :class:`AcceptanceStats` this
        prophet's nodes of this tree are estimated and judged. By default the prophet's name
        and how deep it drafted this time (``"prompt-lookup:9+"``): a prophet that drafts deep
        only when it is sure (prompt lookup on a long match, retrieval on a long suffix) gets
        separate statistics for its sure and its unsure proposals.
    """

    def __init__(self, root: int):
        self.tokens, self.parents, self.depths = [int(root)], [-1], [0]
        self.sources: list = [{}]
        self.labels: dict = {}
        self._children: list = [{}]

    def label(self, prophet: str) -> str:
        return self.labels.get(prophet, prophet)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, prophet: str, rank: int) -> int:
        """The node for ``token`` under ``parent`` (created if new); ``prophet`` is recorded
        with ``rank`` (its best rank there if it proposed the node twice)."""
        node = self._children[parent].get(token)
        if node is None:
            node = len(self.tokens)
            self._children[parent][token] = node
            self.tokens.append(int(token))
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self.sources.append({})
            self._children.append({})
        known = self.sources[node].get(prophet)
        self.sources[node][prophet] = rank if known is None else min(known, rank)
        return node

    def add_tree(self, tokens: list, parents: list, prophet: str, max_depth: int) -> list:
        """Insert a prophet's tree (``tokens[0]`` is the root; ``parents`` with ``-2``
        padding), nodes deeper than ``max_depth`` left out.

        Returns
        -------
        list of int
            The trie node of each of the prophet's nodes (``-1`` for padding, left out).
        """
        where = [0] + [-1] * (len(tokens) - 1)
        ranks: dict = {}
        deepest = 0
        for j in range(1, len(tokens)):
            parent = parents[j]
            if parent < 0 or where[parent] < 0 or self.depths[where[parent]] >= max_depth:
                continue
            rank = ranks.get(parent, 0)
            ranks[parent] = rank + 1
            where[j] = self.add(where[parent], tokens[j], prophet, rank)
            deepest = max(deepest, self.depths[where[j]])
        self.labels.setdefault(prophet, f"{prophet}:{depth_class(deepest)}")
        return where

    def child(self, node: int, token: int) -> int | None:
        return self._children[node].get(token)

    def children(self, node: int) -> dict:
        """``{token: node}`` of ``node``'s children."""
        return self._children[node]


def depth_class(depth: int) -> str:
    """Bucket of a proposal's depth: ``"1-2"``, ``"3-4"``, ``"5-8"`` or ``"9+"``."""
    return "1-2" if depth <= 2 else "3-4" if depth <= 4 else "5-8" if depth <= 8 else "9+"


def _host_trees(proposal, batch: int) -> list:
    """Per request ``(tokens, parents)`` host lists of a chain or tree proposal (root first)."""
    if isinstance(proposal, ChainProposal):
        if proposal.extra is not None:
            raise ValueError("drafters: a merged prophet may not propose extra rows")
        width = proposal.tokens.shape[1]
        drafts = proposal.tokens.tolist() if width else [[] for _ in range(batch)]
        out = []
        for b in range(batch):
            k = proposal.depths[b]
            out.append(([0] + drafts[b][:k], list(range(-1, k))))
        return out
    if isinstance(proposal, TreeProposal):
        if proposal.extra is not None or proposal.typical is not None:
            raise ValueError(
                "drafters: a merged prophet may not propose extra rows or typical acceptance"
            )
        return list(zip(proposal.tokens.tolist(), proposal.parents.tolist()))
    raise TypeError(f"a drafter returned {type(proposal).__name__}, not a proposal")


def budgeted_trees(
    candidates: list, stats: AcceptanceStats, budget: TreeBudget, remaining: list
) -> tuple:
    """Keep, in every request's candidate trie, the nodes the budget chooses.

    Parameters
    ----------
    candidates : list of CandidateTree
        One per request.
    stats : AcceptanceStats
        Gives each node's P(accepted | parent accepted).
    budget : TreeBudget
    remaining : list of int
        Tokens each request may still emit (nodes deeper than ``remaining - 1`` are never
        kept, so a request's tree depends on itself only).

    Returns
    -------
    tokens, parents : Tensor
        ``[B, T]`` int64 stacked trees (``-2`` padding), on the CPU.
    kept : list of list of int
        Per request, the trie node of each tree node.
    depths : list of int
        Each tree's depth.
    """
    scored = []
    for cand, left in zip(candidates, remaining):
        cond = [1.0] + [
            stats.combined({cand.label(p): r for p, r in cand.sources[j].items()},
                           cand.depths[j]) if cand.depths[j] <= left - 1
            else 0.0
            for j in range(1, len(cand))
        ]
        scored.append((cand.parents, path_probabilities(cand.parents, cond)))
    kept, _, _ = budget.choose(scored)
    trees = []
    for cand, nodes in zip(candidates, kept):
        index = {node: i for i, node in enumerate(nodes)}
        trees.append(Tree(
            parents=[-1] + [index[cand.parents[n]] for n in nodes[1:]],
            tokens=[cand.tokens[n] for n in nodes],
        ))
    tokens, parents = stack_trees(trees)
    return tokens, parents, kept, [max(t.depths) for t in trees]


def accepted_path(cand: CandidateTree, emitted: list, num_accepted: int) -> list:
    """Trie nodes of the accepted drafts (root excluded), following the emitted tokens."""
    path, node = [], 0
    for token in emitted[:num_accepted]:
        node = cand.child(node, token)
        if node is None:  # cannot happen: accepted drafts are tree nodes
            break
        path.append(node)
    return path


def judge(cand: CandidateTree, continuation: list, stats: AcceptanceStats) -> bool:
    """Record, in ``stats``, every candidate node whose parent lies on the path the target
    actually took (``continuation``: the tokens emitted after the root, as far as known); it
    held when its token is the one emitted there. Returns whether the judgement is complete
    (the path left the trie) or must wait for more tokens.

    Nodes are judged whether or not they were verified, and at every depth the trie reaches,
    so a prophet's statistics at depth ``d`` do not wait for the budget to keep depth ``d - 1``
    (greedy output is deterministic, so the later tokens are exactly what verification would
    have compared them with; when sampling, a node holds with the probability its one-hot
    verification would accept it)."""
    node = 0
    for target in continuation:
        children = cand.children(node)
        if not children:
            break
        nxt = children.get(target)
        if nxt is None:
            break
        node = nxt
    else:
        if cand.children(node):
            return False  # the path may go on: wait for more tokens
    node = 0
    for target in continuation:
        children = cand.children(node)
        for token, child in children.items():
            for prophet, rank in cand.sources[child].items():
                stats.record(cand.label(prophet), cand.depths[child], rank, token == target)
        node = children.get(target)
        if node is None:
            break
    return True


class OutcomeJudge:
    """Per request, the candidate tries of recent steps waiting for enough emitted tokens to
    be judged (:func:`judge`); one per drafter that keeps :class:`AcceptanceStats`."""

    def __init__(self, batch: int):
        self.pending = [[] for _ in range(batch)]

    def add(self, state: DecodeState, outcome: StepOutcome, candidates: list,
            stats: AcceptanceStats) -> None:
        """Queue this step's tries and judge every queued one that can be."""
        for b, cand in enumerate(candidates):
            self.pending[b].append((cand, outcome.previous_starts[b] + 1))
            ctx = state.contexts[b]
            self.pending[b] = [
                (c, at) for c, at in self.pending[b] if not judge(c, ctx[at:], stats)
            ]

    def select_requests(self, keep: list) -> None:
        self.pending = [self.pending[b] for b in keep]


class MultiDrafter(Drafter):
    """Merges the proposals of several drafters into one cost-budgeted tree per request.

    Parameters
    ----------
    drafters : sequence of Drafter
        The prophets (at least one). Names must differ (a repeated name gets ``#2``, ...).
    cost_curve : str, Path, dict, StepCost or None
        The step-cost curve ``c(T)`` the budget uses (the shipped CPU curve by default).
    max_nodes : int
        Most drafted nodes per request and step.
    priors : dict, optional
        ``{prophet name: P(first draft accepted)}`` before any evidence (see
        :class:`~specdec_kernels.decoding.budget.AcceptanceStats`).

    Raises
    ------
    ValueError
        An empty drafter list, drafters asking for different target features, or bad sizes.
    """

    name = "multi"

    def __init__(self, drafters, *, cost_curve=None, max_nodes: int = 24, priors=None):
        drafters = list(drafters)
        if not drafters:
            raise ValueError("drafters: give at least one drafter to merge")
        if not all(isinstance(d, Drafter) for d in drafters):
            raise ValueError("drafters: every entry must be a Drafter")
        check_size("max_nodes", max_nodes, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        kinds = {d.target_features for d in drafters} - {None}
        if len(kinds) > 1:
            raise ValueError(f"drafters: they ask for different target features {sorted(kinds)}")
        self.target_features = kinds.pop() if kinds else None
        self.drafters = drafters
        self.names = _unique_names([d.name for d in drafters])
        self.cost_curve = cost_curve
        self.max_nodes = max_nodes
        self.priors = dict(priors or {})
        self.budget: TreeBudget | None = None
        self.stats = AcceptanceStats(priors=self.priors)
        self._candidates: list = []
        self._maps: list = []
        self._totals: dict = {}
        self._emitted = 0

    def bind(self, runner, tokenizer) -> None:
        for d in self.drafters:
            d.bind(runner, tokenizer)
        self.budget = TreeBudget(self.cost_curve, max_nodes=self.max_nodes)

    def max_block_width(self) -> int:
        drafted = sum(max(d.max_block_width() - 1, 0) for d in self.drafters)
        return min(drafted, self.max_nodes) + 1

    def describe(self) -> dict:
        return {
            "name": self.name,
            "prophets": [d.describe() for d in self.drafters],
            "max_nodes": self.max_nodes,
            "cost_curve": self.budget.step_cost.source if self.budget else self.cost_curve,
        }

    def start(self, state: DecodeState) -> None:
        for d in self.drafters:
            d.start(state)
        self.stats = AcceptanceStats(priors=self.priors)
        self._judge = OutcomeJudge(state.batch)
        self._totals = {n: {"proposed": 0, "verified": 0, "accepted": 0, "sole": 0}
                        for n in self.names}
        self._emitted = 0

    def propose(self, state: DecodeState) -> TreeProposal:
        batch = state.batch
        roots = state.pending.tolist()
        candidates = [CandidateTree(r) for r in roots]
        maps = [{} for _ in range(batch)]  # per request: prophet -> set of trie nodes
        for name, drafter in zip(self.names, self.drafters):
            proposal = drafter.propose(state)
            for b, (tokens, parents) in enumerate(_host_trees(proposal, batch)):
                where = candidates[b].add_tree(
                    tokens, parents, name, max_depth=max(state.remaining[b] - 1, 0)
                )
                nodes = {w for w in where[1:] if w > 0}
                maps[b][name] = nodes
                self._totals[name]["proposed"] += len(nodes)
        tokens, parents, kept, depths = budgeted_trees(
            candidates, self.stats, self.budget, state.remaining
        )
        for b, nodes in enumerate(kept):
            for node in nodes[1:]:
                for name in candidates[b].sources[node]:
                    self._totals[name]["verified"] += 1
        self._candidates, self._maps = candidates, maps
        device = state.pending.device
        return TreeProposal(
            tokens.to(device, non_blocking=True), parents.to(device, non_blocking=True), depths
        )

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        per_prophet = {n: [] for n in self.names}
        for b, cand in enumerate(self._candidates):
            n = outcome.num_accepted[b]
            start = outcome.previous_starts[b] + 1
            emitted = state.contexts[b][start : start + n + 1]
            path = accepted_path(cand, emitted, n)
            self._emitted += n + 1
            for node in path:
                sources = cand.sources[node]
                for name in sources:
                    self._totals[name]["accepted"] += 1
                if len(sources) == 1:
                    self._totals[next(iter(sources))]["sole"] += 1
            for name in self.names:
                mine = self._maps[b][name]
                count = 0
                while count < len(path) and path[count] in mine:
                    count += 1
                per_prophet[name].append(count)
        self._judge.add(state, outcome, self._candidates, self.stats)
        for name, drafter in zip(self.names, self.drafters):
            drafter.accept(state, StepOutcome(outcome.previous_starts, per_prophet[name]))

    def select_requests(self, keep: list) -> None:
        self._judge.select_requests(keep)
        for d in self.drafters:
            d.select_requests(keep)

    def finish(self) -> None:
        for d in self.drafters:
            d.finish()

    def report(self) -> dict:
        emitted = max(self._emitted, 1)
        prophets = {}
        for name in self.names:
            t = self._totals.get(name, {})
            prophets[name] = {
                "nodes_proposed": t.get("proposed", 0),
                "nodes_verified": t.get("verified", 0),
                "drafts_accepted": t.get("accepted", 0),
                "drafts_accepted_alone": t.get("sole", 0),
                "share_of_emitted_tokens": round(t.get("accepted", 0) / emitted, 4),
            }
        return {"prophets": prophets, "emitted_tokens": self._emitted,
                "acceptance_by_depth_rank": self.stats.table()}


def _unique_names(names: list) -> list:
    seen: dict = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out
