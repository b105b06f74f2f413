"""The cost-model budget of a tree of drafts (EAGLE-2's idea, across prophets): the candidate
drafts of a request merge into a trie that remembers each node's prophets
(:class:`CandidateTree`), each node's chance of being accepted is estimated from its prophets'
running statistics by depth and rank (:class:`AcceptanceStats`), :class:`TreeBudget` keeps the
nodes that maximise expected tokens per unit of step cost under the device's measured ``c(T)``
(:class:`~specdec_kernels.decoding.cost.StepCost`) (:func:`budgeted_trees`), and once the
target has spoken every candidate is judged into the statistics (:class:`OutcomeJudge`). This
greedy choice is the only one in the package: merged and retrieval trees go through it every
step, a static rank-path tree (Medusa, token recycling) once (:func:`choose_tree`). A chain of
drafts (a draft model, the target's first layers) is sized the same way each step by
:class:`ChainBudget`, which also weighs the draft's own forwards.

Expected tokens of a kept set ``S`` of drafted nodes: ``1 + sum_{n in S} P(path to n is
accepted)`` (the target's own token, plus every node whose whole path holds). With
``P(path) = prod cond(node)`` along the path and ``cond <= 1``, a node is never more likely
than its parent, so for every size ``n`` the ``n`` most likely nodes (parents first on ties)
form a valid tree and are the best ``n``-node tree; the size kept maximises
``expected / c(width)``. A batch shares one block: the kept size ``n`` is common to every
request, and the block's cost is ``c(B * (n + 1))`` (the step's linear layers see
``B * T`` rows; the shipped curve is measured per row count).

Every choice is costed at the step's context (``context``: the cached rows its attention reads,
the batch's mean for a shared block, :attr:`DecodeState.context_length
<specdec_kernels.decoding.drafter.DecodeState.context_length>`): a verified row costs more
after 2k tokens than after 256 (:class:`~specdec_kernels.decoding.cost.StepCost`), so trees and
chains shrink as a request's context grows.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.tree import Tree, Trie, stack_trees, tree_from_choices

__all__ = [
    "CHAIN_PRIOR",
    "CLASS_PRIORS",
    "CONTEXT_STEP",
    "DEPTH_PRIOR_WEIGHT",
    "MAX_PAUSE_STEPS",
    "PAUSE_STEPS",
    "PROBE_STEPS",
    "AcceptanceStats",
    "CandidateTree",
    "ChainBudget",
    "ChainBudgets",
    "OutcomeJudge",
    "ProphetPause",
    "TreeBudget",
    "budgeted_trees",
    "choose_tree",
    "expected_tokens",
    "judge",
    "path_probabilities",
]

#: Cached rows by which a request's context must move before a choice kept between steps (token
#: recycling's template) is made again at the new context: 128 rows move the development CPU's
#: float32 c(16) by 1.4 ms of its 29-48 ms (256 to 2048 cached tokens, 2026-12-04).
CONTEXT_STEP = 128

#: Prior acceptance of a node by how deep its prophet drafted this time (the class in a
#: statistics key ``"name:class"``, see ``CandidateTree.labels``): evidence replaces it within
#: a few steps, but until then a prophet that drafts 9+ deep (prompt lookup on a long match)
#: gets deep trees at once. Chosen on the default model's dev prompts.
CLASS_PRIORS = {"1-2": 0.3, "3-4": 0.5, "5-8": 0.7, "9+": 0.85}


@dataclass
class AcceptanceStats:
    """Running acceptance of each prophet's nodes by depth and rank.

    A node counts as *tried* when its parent was accepted (the root always is), and as
    *accepted* when it was; ``rate`` is the posterior mean of ``accepted / tried`` under a
    Beta prior of mean ``prior(prophet, depth, rank)`` and weight ``prior_weight``.

    Parameters
    ----------
    prior_weight : float
        Pseudo-observations of the prior (how fast measured rates take over).
    priors : dict, optional
        ``{key: p}``: prior acceptance of a prophet's rank-0 node at depth 1; deeper and
        lower-ranked nodes get ``p * 0.95 ** (depth - 1) / (rank + 1)``. Without an entry for
        the key (``"name:class"``): the entry for its name, else by its class
        (:data:`CLASS_PRIORS`), else ``default_prior``.
    max_depth, max_rank : int
        Deeper / lower-ranked nodes share the statistics of the last bucket.
    """

    prior_weight: float = 1.0
    priors: dict = field(default_factory=dict)
    max_depth: int = 12
    max_rank: int = 4
    default_prior: float = 0.3
    counts: dict = field(default_factory=dict)  # (prophet, depth, rank) -> [tried, accepted]
    #: Nodes recorded so far: rates change only when this does, so a choice made from them
    #: can be kept until it moves (token recycling's template while it drafts nothing).
    records: int = 0

    def _key(self, prophet: str, depth: int, rank: int) -> tuple:
        return prophet, min(max(depth, 1), self.max_depth), min(max(rank, 0), self.max_rank)

    def prior(self, prophet: str, depth: int, rank: int) -> float:
        """Prior P(accepted | parent accepted): ``priors[key]``, else ``priors[name]`` (a
        prophet's own measured prior), else by the key's class (how deep the prophet chose to
        draft: a prophet drafts deep only when it is sure, see :data:`CLASS_PRIORS`), else
        ``default_prior``; lower for deeper and lower-ranked nodes."""
        name, _, kind = prophet.partition(":")
        base = self.priors.get(prophet, self.priors.get(name))
        if base is None:
            base = CLASS_PRIORS.get(kind, self.default_prior)
        return base * 0.95 ** (max(depth, 1) - 1) / (max(rank, 0) + 1)

    def rate(self, prophet: str, depth: int, rank: int) -> float:
        """Estimated P(node accepted | parent accepted)."""
        tried, accepted = self.counts.get(self._key(prophet, depth, rank), (0, 0))
        w = self.prior_weight
        return (accepted + w * self.prior(prophet, depth, rank)) / (tried + w)

    def record(self, prophet: str, depth: int, rank: int, accepted: bool) -> None:
        """One tried node of ``prophet`` at ``depth`` (1 = child of the root) and ``rank``."""
        entry = self.counts.setdefault(self._key(prophet, depth, rank), [0, 0])
        entry[0] += 1
        entry[1] += int(accepted)
        self.records += 1

    def combined(self, sources: dict, depth: int) -> float:
        """P(node accepted | parent accepted) for a node proposed by several prophets
        (``{prophet: rank}``), taking their evidence as independent:
        ``1 - prod(1 - rate)``."""
        miss = 1.0
        for prophet, rank in sources.items():
            miss *= 1.0 - self.rate(prophet, depth, rank)
        return 1.0 - miss

    def table(self) -> dict:
        """``{prophet: {"depth,rank": [tried, accepted]}}`` (for reports)."""
        out: dict = {}
        for (prophet, depth, rank), (tried, accepted) in sorted(self.counts.items()):
            out.setdefault(prophet, {})[f"{depth},{rank}"] = [tried, accepted]
        return out


def path_probabilities(parents: list, cond: list) -> list:
    """``P(path to node j accepted)`` for every node of a tree.

    Parameters
    ----------
    parents : list of int
        ``[T]`` parent of each node (node 0 the root, ``-1``; ``parents[j] < j``).
    cond : list of float
        ``[T]`` P(node accepted | parent accepted) (the root's entry is ignored).

    Returns
    -------
    list of float
        ``[T]``, the root's 1.
    """
    probs = [1.0] * len(parents)
    for j in range(1, len(parents)):
        parent = parents[j]
        if not 0 <= parent < j:
            raise ValueError(f"parents: node {j} has parent {parent}; need 0 <= parent < {j}")
        probs[j] = probs[parent] * min(max(cond[j], 0.0), 1.0)
    return probs


class TreeBudget:
    """Chooses how many drafted nodes each step verifies, and which.

    Parameters
    ----------
    step_cost : StepCost, str, dict or None
        ``c(T)`` (see :meth:`StepCost.load`; ``None``: the shipped CPU curve).
    max_nodes : int
        Most drafted nodes per request (root excluded).
    overhead_ms : float
        Cost per step paid whatever the tree (drafting), added to ``c``.
    """

    def __init__(self, step_cost=None, *, max_nodes: int = 32, overhead_ms: float = 0.0):
        if max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
        self.step_cost = StepCost.load(step_cost)
        self.max_nodes = max_nodes
        self.overhead_ms = overhead_ms

    def cost(self, width: int, batch: int = 1, context: float | None = None) -> float:
        """Cost of one step whose block is ``width`` rows per request after ``context`` cached
        rows (``None``: the curve's shortest measured context)."""
        return self.step_cost(batch * width, context) + self.overhead_ms

    @staticmethod
    def order(parents: list, probs: list) -> list:
        """Drafted nodes (``1 .. T - 1``) of non-zero probability, most likely first, parents
        before children."""
        depth = [0] * len(parents)
        for j in range(1, len(parents)):
            depth[j] = depth[parents[j]] + 1
        nodes = [j for j in range(1, len(parents)) if probs[j] > 0]
        return sorted(nodes, key=lambda j: (-probs[j], depth[j], j))

    def choose(self, trees: list, context: float | None = None) -> tuple:
        """The kept nodes of every request's tree.

        Parameters
        ----------
        trees : list of (list of int, list of float)
            Per request, ``(parents, path_probs)`` of its candidate tree (node 0 the root).
        context : float, optional
            Cached rows the step's attention reads per request (see :meth:`cost`).

        Returns
        -------
        kept : list of list of int
            Per request, the kept node indices (root included, increasing: every kept
            node's parent is kept).
        expected : float
            Expected tokens per step of the whole batch with that choice.
        cost : float
            The step's cost (``c(B * (n + 1)) + overhead_ms``).
        """
        batch = len(trees)
        orders = [self.order(parents, probs) for parents, probs in trees]
        longest = min(max((len(o) for o in orders), default=0), self.max_nodes)
        # Expected tokens when every request keeps its n most likely nodes, for each n.
        best_n, expected = 0, float(batch)
        best_value = expected / self.cost(1, batch, context)
        running = float(batch)
        for n in range(1, longest + 1):
            for (_, probs), order in zip(trees, orders):
                if n <= len(order):
                    running += probs[order[n - 1]]
            value = running / self.cost(n + 1, batch, context)
            if value > best_value:
                best_n, expected, best_value = n, running, value
        kept = [sorted([0] + order[:best_n]) for order in orders]
        return kept, expected, self.cost(best_n + 1, batch, context)


# ---------------------------------------------------------------------------- pauses

#: Steps a prophet that did not pay sits out before it proposes again (doubled while it keeps
#: not paying, up to :data:`MAX_PAUSE_STEPS`).
PAUSE_STEPS = 8
MAX_PAUSE_STEPS = 128
#: Steps a prophet proposes (after the start, or after a pause) before it can be paused.
PROBE_STEPS = 6
#: Weight of the newest step in the running averages of a prophet's credit and cost.
_RECENT = 0.25


class ProphetPause:
    """Whether a drafter that may not pay proposes this step: running averages of what its
    accepted drafts were worth and what its proposing cost, in one unit of time a step.

    The merged drafter feeds it measured proposing time
    (:class:`~specdec_kernels.decoding.multi.MultiDrafter`), :class:`ChainBudget` the modelled
    cost of a chain's step. After :data:`PROBE_STEPS` steps with credit below cost it answers
    no for a pause of :data:`PAUSE_STEPS` steps, doubled at each new pause up to
    :data:`MAX_PAUSE_STEPS`, reset once the credit covers the cost.
    """

    def __init__(self):
        self.steps_paused = 0
        self._worth = self._cost = 0.0
        self._observed = 0  # steps proposed since the start or the last pause
        self._left = 0  # steps left in the current pause
        self._next_pause = PAUSE_STEPS

    def proposes(self) -> bool:
        """Whether the prophet proposes this step (counts a paused step)."""
        if self._left > 0:
            self._left -= 1
            self.steps_paused += 1
            return False
        return True

    def record(self, worth: float, cost: float, start: tuple | None = None) -> None:
        """A step it proposed: its credit and its proposing cost (same unit).

        ``start``: ``(worth, cost)`` the averages start from (at the start and after each
        pause) when the caller has a prior belief; without it they start at this step's."""
        if self._observed == 0:
            self._worth, self._cost = (worth, cost) if start is None else start
        self._worth += _RECENT * (worth - self._worth)
        self._cost += _RECENT * (cost - self._cost)
        self._observed += 1
        if self._observed < PROBE_STEPS:
            return
        if self._worth < self._cost:
            self._left, self._observed = self._next_pause, 0
            self._next_pause = min(2 * self._next_pause, MAX_PAUSE_STEPS)
        else:
            self._next_pause = PAUSE_STEPS


# ---------------------------------------------------------------------------- chains

#: Pseudo-observations with which a chain's depth ``j`` starts at depth ``j - 1``'s rate. A
#: chain's acceptance given the depth before is nearly flat in depth (the int4 copy of the
#: default model on held-out prompts: 0.76, 0.80, 0.82), so each depth leans on the one before
#: until its own tries outweigh it.
DEPTH_PRIOR_WEIGHT = 4.0
#: A chain's first-draft acceptance before any evidence, for a drafter that states none.
CHAIN_PRIOR = 0.5


class ChainBudget:
    """How many drafts one request's chain holds each step, from ``0`` to a cap.

    A chain of ``K`` drafts is expected to emit ``E(K) = 1 + sum_{i <= K} prod_{j <= i} a_j``
    tokens, ``a_j`` the acceptance of depth ``j`` when depth ``j - 1`` was accepted, and to
    cost ``c_t(K + 1) + K c_d(1)``: the target verifies ``K + 1`` rows, the draft runs ``K``
    forwards, both at the step's context. The length kept maximises ``E(K) / cost(K)`` over
    ``1 .. cap``. ``a_j`` is the
    posterior mean of what depth ``j`` measured under a prior of :data:`DEPTH_PRIOR_WEIGHT`
    observations at ``a_{j-1}`` (``a_1``'s prior is ``first_draft_prior``, one observation): a
    depth never tried is taken to do as well as the one before, so a chain that is accepted
    grows until a depth measures worse, and a few unlucky first tries of a depth do not shut
    it for the rest of the run.

    Whether drafting pays at all is judged over recent steps (:class:`ProphetPause`) on the
    same model: credit is the accepted drafts times a plain step's cost ``c_t(1)``, cost is
    what the step cost beyond a plain one (``cost(K) - c_t(1)``), both averaged from the
    credit the prior expects (``first_draft_prior`` at every depth); while paused the request
    gets no drafts. A draft that would not pay even if every draft were accepted
    (:meth:`can_pay`) is never run.

    One budget per request, costed as if the request ran alone: a request's lengths, and so
    its sampled output, do not depend on the rest of its batch. Nothing here is timed: with
    the same curves and outcomes the lengths are the same, so a seeded sampled run repeats.

    Parameters
    ----------
    target_cost : StepCost, str or dict
        ``c_t(T)``, the target's forward over ``T`` rows (see :meth:`StepCost.load`).
    draft_cost : StepCost, str, dict or None
        ``c_d(T)``, the draft's; ``None``: drafts cost nothing to make (Jacobi's guesses are
        the step's own outputs), only their verification.
    first_draft_prior : float, optional
        P(first draft accepted) before any evidence (default :data:`CHAIN_PRIOR`).
    """

    def __init__(self, target_cost, draft_cost, *, first_draft_prior: float | None = None):
        if first_draft_prior is None:
            first_draft_prior = CHAIN_PRIOR
        if not 0.0 < first_draft_prior < 1.0:
            raise ValueError(f"first_draft_prior must be in (0, 1), got {first_draft_prior}")
        self.target_cost = StepCost.load(target_cost)
        self.draft_cost = None if draft_cost is None else StepCost.load(draft_cost)
        self.first_draft_prior = first_draft_prior
        self.counts: list = []  # per depth - 1: [tried, accepted]
        self.pause = ProphetPause()
        self.lengths: dict = {}  # chosen length -> steps
        self.context: float | None = None  # of the step whose length was chosen last

    def cost(self, length: int, context: float | None = None) -> float:
        """Modelled cost of a step that drafts ``length`` tokens after ``context`` cached
        rows (``None``: the curve's shortest measured context)."""
        drafting = 0.0 if self.draft_cost is None else length * self.draft_cost(1, context)
        return self.target_cost(length + 1, context) + drafting

    def rates(self, length: int) -> list:
        """``[a_1, ..., a_length]``: estimated acceptance by depth, given the depth before."""
        out, prior, weight = [], self.first_draft_prior, 1.0
        for depth in range(length):
            tried, accepted = self.counts[depth] if depth < len(self.counts) else (0, 0)
            prior = (accepted + weight * prior) / (tried + weight)
            out.append(prior)
            weight = DEPTH_PRIOR_WEIGHT
        return out

    def can_pay(self, cap: int, context: float | None = None) -> bool:
        """Whether some length up to ``cap`` would beat a plain step if every draft were
        accepted (a draft that costs about a target token never can: it is not even probed)."""
        plain = self.target_cost(1, context)
        return any((k + 1) * plain > self.cost(k, context) for k in range(1, cap + 1))

    def length(self, cap: int, context: float | None = None) -> int:
        """Drafts to propose this step (``0``: paused, or ``cap <= 0``), costed after
        ``context`` cached rows; call once a step (:meth:`record` costs the step at the same
        context)."""
        self.context = context
        if cap <= 0:
            return 0
        best = 0
        if self.can_pay(cap, context) and self.pause.proposes():
            best_value = expected = path = 1.0
            for k, rate in enumerate(self.rates(cap), start=1):
                path *= rate
                expected += path
                value = expected / self.cost(k, context)
                if best == 0 or value > best_value:
                    best, best_value = k, value
        self.lengths[best] = self.lengths.get(best, 0) + 1
        return best

    def record(self, drafted: int, accepted: int) -> None:
        """One step that proposed ``drafted > 0`` drafts, ``accepted`` of them accepted."""
        # Depth j was tried when depth j - 1 was accepted.
        for depth in range(min(accepted + 1, drafted)):
            while len(self.counts) <= depth:
                self.counts.append([0, 0])
            self.counts[depth][0] += 1
            self.counts[depth][1] += int(depth < accepted)
        plain = self.target_cost(1, self.context)
        # The running averages start (and restart after a pause) from what the prior
        # expects of this length, so a few unlucky first steps do not pause a drafter the
        # prior trusts; steady rejections still do within PROBE_STEPS.
        prior, expected = self.first_draft_prior, 0.0
        for depth in range(1, drafted + 1):
            expected += prior ** depth
        cost = self.cost(drafted, self.context) - plain
        self.pause.record(accepted * plain, cost, start=(expected * plain, cost))

    def report(self) -> dict:
        """Steps by chosen length (``0``: paused, or a draft that cannot pay; steps with no
        room for a draft are not counted), steps paused, and ``[tried, accepted]`` by depth."""
        return {"lengths": dict(sorted(self.lengths.items())),
                "steps_paused": self.pause.steps_paused,
                "by_depth": [list(c) for c in self.counts]}


class ChainBudgets:
    """The :class:`ChainBudget` of every request of a run (finished requests kept for the
    report).

    Parameters
    ----------
    batch : int
    target_cost, draft_cost, first_draft_prior
        See :class:`ChainBudget`.
    """

    def __init__(self, batch: int, target_cost, draft_cost, *, first_draft_prior=None):
        self.running = [ChainBudget(target_cost, draft_cost, first_draft_prior=first_draft_prior)
                        for _ in range(batch)]
        self.finished: list = []

    def lengths(self, caps: list, contexts: list | None = None) -> list:
        """Each running request's drafts this step, within its cap, costed at its context
        (``contexts``: cached rows per request, :attr:`DecodeState.starts
        <specdec_kernels.decoding.drafter.DecodeState.starts>`)."""
        contexts = [None] * len(caps) if contexts is None else contexts
        return [budget.length(cap, context)
                for budget, cap, context in zip(self.running, caps, contexts)]

    def record(self, drafted: list, accepted: list) -> None:
        """Per running request: drafts proposed and accepted (requests without drafts skip)."""
        for budget, d, a in zip(self.running, drafted, accepted):
            if d > 0:
                budget.record(d, a)

    def select_requests(self, keep: list) -> None:
        kept = set(keep)
        self.finished += [b for i, b in enumerate(self.running) if i not in kept]
        self.running = [self.running[i] for i in keep]

    def report(self) -> dict:
        """Every request's :meth:`ChainBudget.report`, summed."""
        lengths: dict = {}
        by_depth: list = []
        paused = 0
        for budget in self.finished + self.running:
            part = budget.report()
            for k, n in part["lengths"].items():
                lengths[k] = lengths.get(k, 0) + n
            for depth, (tried, accepted) in enumerate(part["by_depth"]):
                if depth == len(by_depth):
                    by_depth.append([0, 0])
                by_depth[depth][0] += tried
                by_depth[depth][1] += accepted
            paused += part["steps_paused"]
        return {"lengths": dict(sorted(lengths.items())), "steps_paused": paused,
                "by_depth": by_depth}


# ---------------------------------------------------------------------------- candidates


class CandidateTree(Trie):
    """A trie of drafts rooted at a request's pending token, with each node's prophets: the
    candidates the budget chooses from.

    Attributes
    ----------
    tokens, parents, depths : list of int
        Per node (node 0 the root: the pending token, parent ``-1``, depth 0), as in
        :class:`~specdec_kernels.tree.Trie`.
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
        super().__init__(root)
        self.sources: list = [{}]
        self.labels: dict = {}

    def label(self, prophet: str) -> str:
        return self.labels.get(prophet, prophet)

    def propose(self, parent: int, token: int, prophet: str, rank: int) -> int:
        """The node for ``token`` under ``parent`` (made if new), with ``prophet`` recorded at
        ``rank`` (its best rank there if it proposed the node twice)."""
        node = self.add(parent, token)
        if node == len(self.sources):
            self.sources.append({})
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
            where[j] = self.propose(where[parent], tokens[j], prophet, rank)
            deepest = max(deepest, self.depths[where[j]])
        self.labels.setdefault(prophet, f"{prophet}:{depth_class(deepest)}")
        return where


def depth_class(depth: int) -> str:
    """Bucket of a proposal's depth: ``"1-2"``, ``"3-4"``, ``"5-8"`` or ``"9+"``."""
    return "1-2" if depth <= 2 else "3-4" if depth <= 4 else "5-8" if depth <= 8 else "9+"


def budgeted_trees(
    candidates: list, stats: AcceptanceStats, budget: TreeBudget, remaining: list,
    context: float | None = None,
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
    context : float, optional
        Cached rows the step's attention reads per request (:meth:`TreeBudget.choose`).

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
    kept, _, _ = budget.choose(scored, context)
    trees = [cand.tree(nodes) for cand, nodes in zip(candidates, kept)]
    tokens, parents = stack_trees(trees)
    return tokens, parents, kept, [max(t.depths) for t in trees]


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

    def add(self, contexts: list, previous_starts: list, candidates: list,
            stats: AcceptanceStats | list) -> None:
        """Queue this step's tries (rooted at the pending token after ``previous_starts[b]``
        committed rows) and judge every queued one that ``contexts`` (prompt and emitted
        tokens, ``DecodeState.contexts``) now settles, into ``stats``: one
        :class:`AcceptanceStats` for the batch, or a list of one per request (a request's
        trees then depend on its own history only)."""
        for b, cand in enumerate(candidates):
            self.pending[b].append((cand, previous_starts[b] + 1))
            ctx = contexts[b]
            own = stats[b] if isinstance(stats, list) else stats
            self.pending[b] = [
                (c, at) for c, at in self.pending[b] if not judge(c, ctx[at:], own)
            ]

    def select_requests(self, keep: list) -> None:
        self.pending = [self.pending[b] for b in keep]


# ---------------------------------------------------------------------------- rank-path trees


def expected_tokens(choices, rank_accuracy) -> float:
    """Expected tokens per step of a tree: 1 (the target's own token) plus, for every node,
    the probability that its whole path is right, taking heads as independent with
    ``rank_accuracy[k][r]`` = P(head ``k``'s rank-``r`` guess is the token)."""
    total = 1.0
    for c in choices:
        p = 1.0
        for k, r in enumerate(c):
            row = rank_accuracy[k] if k < len(rank_accuracy) else []
            p *= row[r] if r < len(row) else 0.0
        total += p
    return total


def choose_tree(
    rank_accuracy,
    step_cost: StepCost,
    *,
    head_cost_ms: float = 0.0,
    max_nodes: int = 64,
    chain: bool = False,
    context: float | None = None,
) -> tuple[Tree, float, float]:
    """The static tree that maximises expected tokens per unit of step cost: the cost-model
    budget (:class:`TreeBudget`) applied once to a rank-path tree (Medusa's heads, token
    recycling's template), with heads taken as independent (a node's chance is the product of its
    ranks' accuracies along its path).

    Parameters
    ----------
    rank_accuracy : sequence of sequence of float
        ``[N][K]``: P(the rank-``r`` guess at depth ``k + 1`` is the token) (for Medusa, head
        ``k``'s).
    step_cost : StepCost
        ``c(T)``, the target forward over ``T`` tokens.
    head_cost_ms : float
        The heads' own cost per step (paid whatever the tree).
    max_nodes : int
        Most drafted nodes considered.
    chain : bool
        Only rank-0 guesses (blockwise decoding's chain).
    context : float, optional
        Cached rows the step's attention reads (see :meth:`TreeBudget.cost`).

    Returns
    -------
    tree : Tree
        With ranks (its rank paths are :attr:`~specdec_kernels.tree.Tree.choices`), nodes in
        Medusa's (depth, path) order.
    expected : float
        Expected tokens per step (accepted drafts + 1) under ``rank_accuracy``.
    cost_ms : float
        The step's cost ``c(T) + head_cost_ms``.
    """
    accuracy = [list(map(float, row)) for row in rank_accuracy]
    if chain:
        accuracy = [row[:1] for row in accuracy]
    candidates = tree_from_choices(_likely_rank_paths(accuracy, max_nodes))
    nodes = zip(candidates.depths[1:], candidates.ranks[1:])
    cond = [1.0] + [accuracy[depth - 1][rank] for depth, rank in nodes]
    budget = TreeBudget(step_cost, max_nodes=max_nodes, overhead_ms=head_cost_ms)
    scored = (candidates.parents, path_probabilities(candidates.parents, cond))
    (kept,), expected, cost = budget.choose([scored], context)
    choices = candidates.choices
    return tree_from_choices([choices[j - 1] for j in kept[1:]]), expected, cost


def _likely_rank_paths(accuracy: list, count: int) -> list:
    """The ``count`` rank paths most likely to be right, the rank-path tree cut to what the
    budget may keep: a path is never likelier than its prefix, so they form a tree. Ties go as
    in :meth:`TreeBudget.order` (shallower first, then by path)."""
    paths: list = []
    frontier: list = []

    def push(path: tuple, p: float) -> None:
        if len(path) < len(accuracy):
            for r, a in enumerate(accuracy[len(path)]):
                if a > 0:
                    heapq.heappush(frontier, (-(p * a), len(path) + 1, path + (r,)))

    push((), 1.0)
    while frontier and len(paths) < count:
        neg, _, path = heapq.heappop(frontier)
        paths.append(path)
        push(path, -neg)
    return paths
