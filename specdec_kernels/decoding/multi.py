"""Several prophets at once: every drafter proposes, the proposals merge into one trie per
request, a cost-model budget keeps the nodes worth verifying, the target verifies the tree
once, and every prophet is told what was accepted.

Merging
-------
Each prophet's chain or tree is inserted into a trie rooted at the pending token
(:class:`~specdec_kernels.decoding.budget.CandidateTree`): a node is ``(parent, token)``, so
the same continuation proposed twice (by two prophets, or twice by one) is one node, which
remembers every prophet that proposed it and at which *rank* (its order among that prophet's
children of the same parent).

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
whether or not the budget kept its whole proposal); its logits, tokens and accepted rows
are the merged block's (what the target predicted after every node, whoever proposed it).
Drafters whose proposals carry :class:`~specdec_kernels.decoding.drafter.ExtraRows` or an
acceptance rule other than ``LOSSLESS`` cannot be merged (``ValueError``).

Pausing a prophet that does not pay
-----------------------------------
The budget weighs each node's chance against what verifying it costs, but not what proposing
cost: a prophet's time is paid every step, kept or not (measured at file precision on
mt_bench: drafts verified on 95% of steps, 10% accepted, the prophets 7-10% of the run). A
prophet that declares itself :attr:`~specdec_kernels.decoding.drafter.Drafter.pausable` is
paused (neither its ``propose`` nor its ``accept`` runs) while its credit, the accepted drafts
it proposed (a draft proposed by ``k`` prophets counts ``1/k`` to each) times a request's share
of a step (``c(B) / B``, ``c(1)`` at batch 1), is
worth less than its own measured proposing time, both as running averages over recent steps.
A pause lasts :data:`PAUSE_STEPS` steps, doubled each time the prophet comes back and still
does not pay (at most :data:`MAX_PAUSE_STEPS`), reset when it does.

Statistics per prophet (in the run's ``drafter_report``): nodes proposed, nodes verified
(kept by the budget), accepted drafts it had proposed, their share of the emitted tokens, and
the steps it was paused.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from specdec_kernels.decoding.acceptance import LOSSLESS
from specdec_kernels.decoding.budget import (
    MAX_PAUSE_STEPS,
    PAUSE_STEPS,
    PROBE_STEPS,
    AcceptanceStats,
    CandidateTree,
    OutcomeJudge,
    ProphetPause,
    TreeBudget,
    budgeted_trees,
)
from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    DecodeState,
    Drafter,
    Proposal,
    StepOutcome,
    TreeProposal,
    check_size,
)
from specdec_kernels.decoding.runner import FeatureSpec

__all__ = ["MAX_PAUSE_STEPS", "PAUSE_STEPS", "PROBE_STEPS", "MultiDrafter", "ProphetPause"]

def _host_trees(proposal: Proposal, pending) -> list:
    """Per request the ``(tokens, parents)`` host lists of a prophet's block (root first)."""
    if not isinstance(proposal, Proposal):
        raise TypeError(f"a drafter returned {type(proposal).__name__}, not a Proposal")
    if proposal.extra is not None or proposal.acceptance != LOSSLESS:
        raise ValueError(
            "drafters: a merged prophet may not propose extra rows or a rule other than lossless"
        )
    tokens, parents = proposal.block(pending)
    return list(zip(tokens.tolist(), parents.tolist()))


class MultiDrafter(Drafter):
    """Merges the proposals of several drafters into one cost-budgeted tree per request.

    Parameters
    ----------
    drafters : sequence of Drafter
        The prophets (at least one). Names must differ (a repeated name gets ``#2``, ...).
    cost_curve : str, Path, dict, StepCost or None
        The step-cost curve ``c(T)`` the budget uses (default: this machine's, see
        :meth:`~specdec_kernels.decoding.runner.ModelRunner.step_cost`).
    max_nodes : int
        Most drafted nodes per request and step.
    priors : dict, optional
        ``{prophet name: P(first draft accepted)}`` before any evidence (see
        :class:`~specdec_kernels.decoding.budget.AcceptanceStats`); by default each prophet's
        :attr:`~specdec_kernels.decoding.drafter.Drafter.first_draft_prior` where it has one.

    Raises
    ------
    ValueError
        An empty drafter list or bad sizes.

    Notes
    -----
    Prophets that read different target features (Medusa heads the final norm, EAGLE three
    decoder layers) share one merged request: every capture point any of them names, every
    prompt row if any keeps its own cache over them; each is handed only its own points'
    columns, and a prophet that asked for the last prompt row gets only that row until the
    first step's features arrive (:meth:`_view`).
    """

    name = "multi"

    def __init__(self, drafters, *, cost_curve=None, max_nodes: int = 24, priors=None):
        drafters = list(drafters)
        if not drafters:
            raise ValueError("drafters: give at least one drafter to merge")
        if not all(isinstance(d, Drafter) for d in drafters):
            raise ValueError("drafters: every entry must be a Drafter")
        check_size("max_nodes", max_nodes, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        self.drafters = drafters
        # Per prophet: None (it reads the merged features as they are, or reads none), or
        # (its points' indices among the merged points, its prompt rows): _merged_features.
        self._columns: list = []
        self._prompt_features = False  # state.features holds the prefill's rows
        self.target_features = self._merged_features()
        self.names = _unique_names([d.name for d in drafters])
        self.cost_curve = cost_curve
        self.max_nodes = max_nodes
        own = {n: d.first_draft_prior for n, d in zip(self.names, drafters)
               if d.first_draft_prior is not None}
        self.priors = {**own, **(priors or {})}
        self.budget: TreeBudget | None = None
        self.stats = AcceptanceStats(priors=self.priors)
        self._candidates: list = []
        self._maps: list = []
        self._pauses: dict = {}
        self._proposed: dict = {}
        self._totals: dict = {}
        self._emitted = 0

    #: Options of ``make_drafter("multi")`` handed to every prophet that declares them.
    SHARED_OPTIONS = ("datastore", "heads", "memory", "cost_curve")

    @classmethod
    def from_options(cls, options, context) -> "MultiDrafter":
        """``make_drafter("multi", prophets=..., ...)``: each prophet made by its registry
        entry with its defaults, plus the shared options it declares (:data:`SHARED_OPTIONS`;
        the cost curve only to prophets that keep their own budget: the others' is off, the
        merged tree is budgeted here), and ``context`` (a draft model: for the prophets that
        draft with one)."""
        from specdec_kernels import drafters as registry
        from specdec_kernels.decoding.factory import DrafterContext, make_drafter

        prophets = options.prophets
        if isinstance(prophets, str):
            prophets = [p.strip() for p in prophets.split(",") if p.strip()]
        prophets = list(prophets)
        if not prophets:
            raise ValueError("prophets: give at least one drafter to merge")
        mergeable = [s.name for s in registry.specs() if s.drafter is not None and s.name != "multi"]
        bad = [p for p in prophets if p not in mergeable]
        if bad:
            raise ValueError(f"prophets: cannot merge {bad}; choose from {mergeable}")
        fields = {p: registry.option_fields(registry.spec(p).options) for p in prophets}
        if options.memory is not None and not any("memory" in f for f in fields.values()):
            readers = [n for n in mergeable
                       if "memory" in registry.option_fields(registry.spec(n).options)]
            raise ValueError(f"memory: only the {' or '.join(readers)} prophet reads a memory; "
                             "add it to prophets")
        takes_model = [p for p in prophets if registry.spec(p).needs_draft_model]
        if context.draft_model is not None and not takes_model:
            raise ValueError("draft_model was given, but no prophet drafts with it: add "
                             "'draft-model' to prophets")
        drafters = []
        for p in prophets:
            given = {k: getattr(options, k) for k in cls.SHARED_OPTIONS if k in fields[p]}
            if "budget" in fields[p]:
                given["budget"] = False  # the merged tree is budgeted
                given.pop("cost_curve", None)
            model = context if p in takes_model else DrafterContext()
            drafters.append(make_drafter(p, draft_model=model.draft_model,
                                         draft_tokenizer=model.draft_tokenizer, **given))
        return cls(drafters, cost_curve=options.cost_curve, max_nodes=options.max_nodes)

    def _merged_features(self, num_layers: int | None = None) -> FeatureSpec | None:
        """The one feature spec the engine captures for all prophets (None: none reads any):
        their capture points in order of first mention (layer indices made non-negative once
        the target's ``num_layers`` is known), every prompt row if any prophet asks for them.
        Sets, per prophet, which of its points' columns it reads (:meth:`_view`)."""
        specs = [FeatureSpec.of(d.target_features) for d in self.drafters]
        points, own = [], []
        for spec in specs:
            layers = None
            if spec is not None:
                layers = spec.resolve(num_layers) if num_layers is not None else spec.layers
                points += [p for p in layers if p not in points]
            own.append(layers)
        if not points:
            self._columns = [None] * len(specs)
            return None
        rows = "all" if any(s is not None and s.prompt_rows == "all" for s in specs) else "last"
        self._columns = [
            None if layers is None or (list(layers) == points and spec.prompt_rows == rows)
            else ([points.index(p) for p in layers], spec.prompt_rows)
            for spec, layers in zip(specs, own)
        ]
        return FeatureSpec(tuple(points), prompt_rows=rows)

    def _view(self, i: int, state: DecodeState) -> DecodeState:
        """``state`` as prophet ``i`` asked for it: the columns of its own capture points of
        the merged features, and while they are the prefill's, only each request's last
        prompt row if it asked for that (the doorway's contract, see drafter.py)."""
        wanted = self._columns[i]
        if wanted is None or state.features is None:
            return state
        points, prompt_rows = wanted
        merged = self.target_features
        features = state.features.unflatten(-1, (len(merged.layers), -1))[:, :, points]
        features, counts = features.flatten(-2), state.feature_counts
        if self._prompt_features and prompt_rows == "last" and merged.prompt_rows == "all":
            index = (counts - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, features.shape[-1])
            features, counts = features.gather(1, index), torch.ones_like(counts)
        return dataclasses.replace(state, features=features, feature_counts=counts)

    def bind(self, runner, tokenizer) -> None:
        for d in self.drafters:
            d.bind(runner, tokenizer)
        # Again once bound: a prophet may learn its capture points then (EAGLE from its files).
        self.target_features = self._merged_features(runner.num_layers)
        self.budget = TreeBudget(runner.step_cost(self.cost_curve), max_nodes=self.max_nodes)

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
        self._prompt_features = True  # the prefill's rows, until the first step's
        for i, d in enumerate(self.drafters):
            d.start(self._view(i, state))
        self.stats = AcceptanceStats(priors=self.priors)
        self._judge = OutcomeJudge(state.batch)
        self._totals = {n: {"proposed": 0, "verified": 0, "accepted": 0, "sole": 0}
                        for n in self.names}
        self._emitted = 0
        self._pauses = {n: ProphetPause() for n, d in zip(self.names, self.drafters) if d.pausable}
        self._proposed = {}  # prophet -> seconds its propose took this step
        self._token_ms = 0.0  # what an accepted draft saved, priced each step

    def propose(self, state: DecodeState) -> TreeProposal:
        batch = state.batch
        roots = state.pending.tolist()
        candidates = [CandidateTree(r) for r in roots]
        maps = [{} for _ in range(batch)]  # per request: prophet -> set of trie nodes
        self._proposed = {}
        for i, (name, drafter) in enumerate(zip(self.names, self.drafters)):
            pause = self._pauses.get(name)
            if pause is not None and not pause.proposes():
                for b in range(batch):
                    maps[b][name] = set()
                continue
            began = time.perf_counter()
            proposal = drafter.propose(self._view(i, state))
            self._proposed[name] = time.perf_counter() - began
            for b, (tokens, parents) in enumerate(_host_trees(proposal, state.pending)):
                where = candidates[b].add_tree(
                    tokens, parents, name, max_depth=max(state.remaining[b] - 1, 0)
                )
                nodes = {w for w in where[1:] if w > 0}
                maps[b][name] = nodes
                self._totals[name]["proposed"] += len(nodes)
        context = state.context_length
        tokens, parents, kept, depths = budgeted_trees(
            candidates, self.stats, self.budget, state.remaining, context
        )
        # A draft accepted in a request of a batch saves that request 1/B of a batch step.
        self._token_ms = self.budget.step_cost(batch, context) / batch
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
        self._prompt_features = False  # the step's accepted rows now
        per_prophet = {n: [] for n in self.names}
        credit = dict.fromkeys(self.names, 0.0)  # accepted drafts, shared ones split
        for b, cand in enumerate(self._candidates):
            n = outcome.num_accepted[b]
            start = outcome.previous_starts[b] + 1
            emitted = state.contexts[b][start : start + n + 1]
            path = cand.follow(emitted[:n])  # the accepted drafts: all of them trie nodes
            self._emitted += n + 1
            for node in path:
                sources = cand.sources[node]
                for name in sources:
                    self._totals[name]["accepted"] += 1
                    credit[name] += 1.0 / len(sources)
                if len(sources) == 1:
                    self._totals[next(iter(sources))]["sole"] += 1
            for name in self.names:
                mine = self._maps[b][name]
                count = 0
                while count < len(path) and path[count] in mine:
                    count += 1
                per_prophet[name].append(count)
        self._judge.add(
            state.contexts, outcome.previous_starts, self._candidates, self.stats
        )
        for i, (name, drafter) in enumerate(zip(self.names, self.drafters)):
            if name not in self._proposed:
                continue  # paused this step: its accept is skipped with its propose
            drafter.accept(self._view(i, state),
                           dataclasses.replace(outcome, num_accepted=per_prophet[name]))
            pause = self._pauses.get(name)
            if pause is not None:
                pause.record(credit[name] * self._token_ms / 1e3, self._proposed[name])

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
                "steps_paused": self._pauses[name].steps_paused if name in self._pauses else 0,
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
