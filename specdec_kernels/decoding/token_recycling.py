"""Token recycling (Luo et al., 2024): every verification forward ranks, at every row of the
block, the whole vocabulary as the next token, and verification uses one token of it. The
rest is kept: per request, a successor table holds the top-``k`` tokens the target last
ranked after each token, and the next draft is a tree walked through the table from the
pending token. No model runs for drafting and nothing is trained.

The successor table
-------------------
Per request, on the model's device: rows keyed by one token (``[V + 1, k]`` int32, as in the
paper) and rows keyed by the last two tokens (a hashed table of :data:`PAIR_SLOTS` rows, each
with its key; a collision overwrites, which costs drafts, never correctness). A node's
successors come from the row of its last two tokens when that row exists, else from the row
of its last token: the pair row tells apart the contexts a token appears in (measured on
requests that copy from their input, it lifts τ by about a tenth, see bench/RESULTS.md).

After each step the top-``k`` of every verified row's logits
(:attr:`~specdec_kernels.decoding.drafter.StepOutcome.logits`, from the step's own forward:
no extra forward and no device read) replace the rows of the token that block row held and of
the pair it ended, rejected branches included: what the target expected after a token in a
context that was not taken is still a good guess for the next time. Where several rows write
one row, the accepted path's (the real context) wins, then the later row. A request's tables
start from its prompt: the tokens that followed each prompt token (and pair) there, most
recent first, then the prompt's most frequent tokens (also the whole row of tokens the prompt
lacks).

Per request, not shared: a table shared by a batch would make a request's drafts, and so its
sampled output, depend on the other requests. One kept from request to request (the paper's
warm start) measured about 8% more tokens per step on the tuning replay (bench/RESULTS.md),
but it carries what one request generated into the drafts of the next: that is the suffix
drafter's opt-in memory's trade (:class:`~specdec_kernels.decoding.suffix.SuffixMemory`), not
taken here.

Drafting
--------
The tree is a template of rank paths: node ``(r1, .., rd)`` holds the ``rd``-th successor of
its parent node's token, gathered level by level on the device. Each request's template is the
cost model's choice (:func:`~specdec_kernels.decoding.budget.choose_tree`: the rank-path tree
that maximises expected tokens per unit of the step cost ``c(T)``), scored by that request's
own running acceptance by depth and rank
(:class:`~specdec_kernels.decoding.budget.AcceptanceStats`, starting from
:data:`RANK_PRIORS`): the tree grows as its drafts hold and shrinks when they fail, sized as if
the request ran alone so that the batch never changes it. The statistics move only when a
node is tried, so the template is chosen again only then (or when the request nears its token
limit), and a request whose template has shrunk to the root alone drafts nothing for the rest
of its run: its table is no longer updated either. Such a request then costs what the plain
loop does (a GGUF file's precision on the AVX2 path, where its trees do not pay: 0.94x the
plain loop before, 1.04x after, bench/RESULTS.md 2026-12-04).

Drafts are one-hot (``probs=None``): sampling goes through the lossless tree rule
(:func:`~specdec_kernels.ops.verify_tree`), greedy decoding gives the target's own output.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from specdec_kernels.decoding.budget import AcceptanceStats, CandidateTree, OutcomeJudge
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    DecodeState,
    Drafter,
    StepOutcome,
    TreeProposal,
    check_size,
)
from specdec_kernels.decoding.budget import CONTEXT_STEP, choose_tree

__all__ = ["MAX_SUCCESSORS", "PAIR_SLOTS", "RANK_PRIORS", "SuccessorTable",
           "TokenRecyclingDrafter", "prompt_successors"]

#: Most successors kept per row: each costs 4 bytes per vocabulary token (and per pair slot)
#: of every request, and the budget rarely verifies more than the first few.
MAX_SUCCESSORS = 64

#: P(node accepted | parent accepted) by depth (rows: 1, 2, 3, 4+) and rank (columns: 0, 1,
#: 2, 3+) before a request has evidence of its own: measured with the default model on
#: generic requests and on requests built around its answers, never the benchmark prompts
#: (``python3 -m bench.prophet_tuning``, see bench/RESULTS.md: the nodes the drafter proposes
#: with its defaults; where those are too few, all candidate nodes; 0.01 where none held).
#: Once a draft holds, the next one usually does too.
RANK_PRIORS = (
    (0.25, 0.077, 0.057, 0.026),
    (0.69, 0.18, 0.032, 0.029),
    (0.75, 0.073, 0.01, 0.01),
    (0.86, 0.097, 0.01, 0.01),
)

#: Rows of a request's pair table: a request meets a few thousand pairs (prompt, output, tree
#: nodes), which fit with few collisions.
PAIR_SLOTS = 1 << 14

_MIX_BEFORE, _MIX_TOKEN = 0x9E3779, 0x85EBCB  # odd multipliers of the pair hash


class SuccessorTable:
    """Per request, the latest top-``k`` successors of every token and of every pair of
    tokens met, on the device (see the module notes).

    Parameters
    ----------
    vocab_size : int
        ``V``; token ids are in ``[0, V)``.
    k : int
        Successors kept per row.
    device : torch.device
    pair_slots : int
        Rows of the pair table (a power of two; no more than the ``V * V`` pairs need).
    """

    def __init__(self, vocab_size: int, k: int, device, pair_slots: int = PAIR_SLOTS):
        if pair_slots < 1 or pair_slots & (pair_slots - 1):
            raise ValueError(f"pair_slots must be a power of two, got {pair_slots}")
        pairs = 1 << max(vocab_size * vocab_size - 1, 1).bit_length()
        self.vocab_size, self.k, self.slots = vocab_size, k, min(pair_slots, pairs)
        self.device = torch.device(device)
        self.single = self.pair = self.pair_keys = None
        self.start([])

    @property
    def batch(self) -> int:
        return self.single.shape[0]

    def _pair(self, before: Tensor, token: Tensor) -> tuple:
        """``(key, slot)`` of pairs (``before``, ``token``); invalid pairs (an id below 0)
        get key ``-1`` and the spare slot ``pair_slots``."""
        valid = (before >= 0) & (token >= 0)
        key = torch.where(valid, before * self.vocab_size + token, -1)
        mixed = torch.bitwise_xor(before * _MIX_BEFORE, token * _MIX_TOKEN) & (self.slots - 1)
        return key, torch.where(valid, mixed, self.slots)

    def start(self, prompts: list) -> None:
        """One table per prompt, filled from the prompt (see the module notes)."""
        batch, k, device = len(prompts), self.k, self.device
        self.single = torch.empty(batch, self.vocab_size + 1, k, dtype=torch.int32, device=device)
        self.pair = torch.zeros(batch, self.slots + 1, k, dtype=torch.int32, device=device)
        self.pair_keys = torch.full((batch, self.slots + 1), -1, dtype=torch.int64, device=device)
        for b, prompt in enumerate(prompts):
            fallback, singles, pairs = prompt_successors(prompt, k, self.vocab_size)
            self.single[b] = torch.tensor(fallback, dtype=torch.int32).to(device)
            if singles:
                index = torch.tensor([t for (t,) in singles], dtype=torch.int64)
                self.single[b, index.to(device)] = _rows(singles.values(), device)
            if pairs:  # pairs in order of their last occurrence: the latest wins a collision
                key, slot = self._pair(*torch.tensor(list(pairs), dtype=torch.int64).T)
                latest = {s: i for i, s in enumerate(slot.tolist())}  # host tensors: no sync
                kept = list(latest.values())
                where = torch.tensor(list(latest), dtype=torch.int64).to(device)
                self.pair_keys[b, where] = key[kept].to(device)
                self.pair[b, where] = _rows([list(pairs.values())[i] for i in kept], device)

    def update(self, tokens: Tensor, parents: Tensor, logits: Tensor,
               accepted_rows: Tensor | None, roots_before: Tensor) -> None:
        """Write the top-``k`` of every row's logits to the rows of the token it held and of
        the pair it ended.

        Parameters
        ----------
        tokens : Tensor
            ``[B, T]`` int64 token of each block row (``-1``: unused row, skipped).
        parents : Tensor
            ``[B, T]`` int64 parent row of each block row (``-1`` the root).
        logits : Tensor
            ``[B, >= T, V]`` the target's logits (row ``j`` predicts the token after row ``j``).
        accepted_rows : Tensor, optional
            ``[B, W]`` int64 rows of the accepted path (``-1`` padding): among rows writing the
            same row these win, then the later row.
        roots_before : Tensor
            ``[B]`` int64 the token before each root (``-1``: none).
        """
        batch, width = tokens.shape
        top = logits[:, :width].topk(self.k, dim=-1).indices.to(torch.int32)
        order = torch.arange(width, device=tokens.device).expand(batch, width)
        if accepted_rows is not None:
            hits = torch.zeros_like(tokens).scatter_add_(
                1, accepted_rows.clamp(min=0), (accepted_rows >= 0).to(tokens.dtype)
            )
            order = order + width * (hits > 0)
        before = torch.where(parents >= 0, tokens.gather(1, parents.clamp(min=0)),
                             roots_before[:, None].expand(batch, width))
        batch_index = torch.arange(batch, device=tokens.device)[:, None]
        single = _winners(tokens, tokens >= 0, order, self.vocab_size)
        self.single[batch_index, single] = top
        key, slot = self._pair(before, tokens)
        slot = _winners(slot, key >= 0, order, self.slots)
        self.pair_keys[batch_index, slot] = key
        self.pair[batch_index, slot] = top

    def walk(self, roots: Tensor, roots_before: Tensor, parents: Tensor, ranks: Tensor,
             depths: Tensor, levels: int) -> Tensor:
        """Tokens of a rank-path tree per request, level by level on the device.

        Parameters
        ----------
        roots, roots_before : Tensor
            ``[B]`` int64 pending tokens and the tokens before them (``-1``: none).
        parents, ranks, depths : Tensor
            ``[B, T]`` int64 per node (node 0 the root; padding nodes have depth ``-1``).
        levels : int
            The deepest node's depth (known on the host: no device read).

        Returns
        -------
        Tensor
            ``[B, T]`` int64 node tokens (the root's on padding nodes).
        """
        batch, width = parents.shape
        tokens = roots[:, None].expand(batch, width).contiguous()
        before = roots_before[:, None].expand(batch, width).contiguous()
        batch_index = torch.arange(batch, device=roots.device)[:, None]
        up, rank = parents.clamp(min=0), ranks.clamp(min=0)
        for depth in range(1, levels + 1):
            last, second = tokens.gather(1, up), before.gather(1, up)
            guess = self.single[batch_index, last, rank]
            key, slot = self._pair(second, last)
            known = (key >= 0) & (self.pair_keys[batch_index, slot] == key)
            guess = torch.where(known, self.pair[batch_index, slot, rank], guess)
            here = depths == depth
            tokens = torch.where(here, guess.to(torch.int64), tokens)
            before = torch.where(here, last, before)
        return tokens

    def select(self, keep: list) -> None:
        index = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.single = self.single.index_select(0, index)
        self.pair = self.pair.index_select(0, index)
        self.pair_keys = self.pair_keys.index_select(0, index)


def _rows(rows, device) -> Tensor:
    return torch.tensor(list(rows), dtype=torch.int32).to(device)


def _winners(rows: Tensor, valid: Tensor, order: Tensor, spare: int) -> Tensor:
    """``rows`` where the entry is valid and no valid entry of higher ``order`` in the same
    request has the same row; ``spare`` (a row never read) elsewhere."""
    same = (rows[:, :, None] == rows[:, None, :]) & valid[:, None, :]
    beaten = (same & (order[:, None, :] > order[:, :, None])).any(2)
    return torch.where(valid & ~beaten, rows, spare)


def prompt_successors(prompt: list, k: int, vocab_size: int) -> tuple:
    """A request's starting rows from its prompt.

    Returns
    -------
    fallback : list of int
        The prompt's ``k`` most frequent tokens (then the smallest other ids).
    singles : dict
        ``{(v,): successors}``: the distinct tokens that followed ``v`` in the prompt, most
        recent first, completed with ``fallback`` (``k`` distinct ids each).
    pairs : dict
        ``{(u, v): successors}`` the same after the pair ``u, v``, completed with the row of
        ``v``; in order of each pair's last occurrence.
    """
    frequent = [t for t, _ in Counter(prompt).most_common(k)]
    fill = iter(t for t in range(vocab_size) if t not in frequent)
    fallback = frequent + [next(fill) for _ in range(k - len(frequent))]
    singles = _followers(prompt, 1, k, lambda key: fallback)
    pairs = _followers(prompt, 2, k, lambda key: singles.get(key[1:], fallback))
    return fallback, singles, pairs


def _followers(prompt: list, order: int, k: int, complete) -> dict:
    """``{context: k distinct successors}`` of every ``order``-token context of the prompt,
    most recent first, completed by ``complete(context)``; contexts by last occurrence."""
    after: dict = {}
    for i in range(len(prompt) - 1, order - 1, -1):
        seen = after.setdefault(tuple(prompt[i - order : i]), [])
        if len(seen) < k and prompt[i] not in seen:
            seen.append(prompt[i])
    rows = {}
    for context in reversed(list(after)):  # after holds contexts latest first
        seen = after[context]
        rows[context] = (seen + [t for t in complete(context) if t not in seen])[:k]
    return rows


class TokenRecyclingDrafter(Drafter):
    """Drafts a tree walked through a per-request table of the target's own recent top-k.

    Parameters
    ----------
    successors : int
        Successors kept per token, ``k`` (the tree's largest branching).
    max_nodes : int
        Most drafted nodes per step (before the budget, which usually keeps fewer).
    max_depth : int
        Deepest node.
    cost_curve : str, Path, dict, StepCost or None
        The step cost ``c(T)`` that sizes the tree (default: this machine's, see
        :meth:`~specdec_kernels.decoding.runner.ModelRunner.step_cost`).
    budget : bool
        Size each request's tree with the cost model and its running acceptance (default);
        ``False`` proposes the ``max_nodes`` most likely nodes (e.g. when a
        :class:`~specdec_kernels.decoding.multi.MultiDrafter` budgets the merged tree).

    Raises
    ------
    ValueError
        Sizes that are not integers, below 1, or above :data:`MAX_SUCCESSORS` (successors) or
        the block limit (``drafter.MAX_BLOCK_WIDTH``).
    """

    name = "token-recycling"
    pausable = True  # reads the contexts at each proposal (see Drafter.pausable)
    first_draft_prior = RANK_PRIORS[0][0]  # its depth is the budget's choice, not confidence

    def __init__(self, *, successors: int = 8, max_nodes: int = 32, max_depth: int = 8,
                 cost_curve=None, budget: bool = True):
        check_size("successors", successors, 1, MAX_SUCCESSORS,
                   f"MAX_SUCCESSORS = {MAX_SUCCESSORS}: every successor kept costs memory per "
                   "vocabulary token of every request")
        for name, value in (("max_nodes", max_nodes), ("max_depth", max_depth)):
            check_size(name, value, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        self.k, self.max_nodes, self.max_depth = successors, max_nodes, max_depth
        self.cost_curve = cost_curve
        self.use_budget = budget
        self.step_cost: StepCost | None = None
        self.table: SuccessorTable | None = None
        self._stats: list = []
        self._judge = OutcomeJudge(0)
        self._proposal = None
        self._templates: list = []  # per request: ((records, depth), tree) of the last choice
        self._nodes_drafted = 0
        self._steps = 0

    def bind(self, runner, tokenizer) -> None:
        if self.k > runner.vocab_size:
            raise ValueError(
                f"successors: {self.k} exceeds the vocabulary of {runner.vocab_size} tokens"
            )
        self.step_cost = runner.step_cost(self.cost_curve)
        self.table = SuccessorTable(runner.vocab_size, self.k, runner.device)

    def max_block_width(self) -> int:
        return self.max_nodes + 1

    def describe(self) -> dict:
        return {"name": self.name, "successors": self.k, "max_nodes": self.max_nodes,
                "max_depth": self.max_depth, "budget": self.use_budget,
                "cost_curve": self.step_cost.source if self.step_cost else self.cost_curve}

    def start(self, state: DecodeState) -> None:
        self.table.start(state.contexts)
        self._stats = [self._new_stats() for _ in range(state.batch)]
        self._templates = [None] * state.batch
        self._judge = OutcomeJudge(state.batch)
        self._nodes_drafted = self._steps = 0

    def _new_stats(self) -> AcceptanceStats:
        return _RankPriorStats(max_depth=self.max_depth, max_rank=self.k - 1)

    def template(self, stats: AcceptanceStats, remaining: int, context: float | None = None):
        """A request's rank-path tree (a :class:`~specdec_kernels.tree.Tree` with ranks) from
        its acceptance so far: cost-optimal after ``context`` cached rows, or the
        ``max_nodes`` likeliest nodes."""
        depth = self._depth_limit(remaining)
        rates = [[stats.rate(self.name, d, r) for r in range(self.k)] for d in range(1, depth + 1)]
        cost = self.step_cost if self.use_budget else _FLAT
        tree, _, _ = choose_tree(rates, cost, max_nodes=self.max_nodes, context=context)
        return tree

    def _depth_limit(self, remaining: int) -> int:
        """The deepest node a request with ``remaining`` tokens to go may draft."""
        return min(self.max_depth, max(remaining - 1, 0))

    def _template_of(self, b: int, remaining: int, context: int):
        """Request ``b``'s template, chosen again only when its statistics or its depth limit
        moved since the last choice, or its context by :data:`CONTEXT_STEP` rows (each choice
        is ~1 ms of Python, a tenth of a decoding step at a GGUF file's precision)."""
        stats = self._stats[b]
        key = (stats.records, self._depth_limit(remaining), context // CONTEXT_STEP)
        cached = self._templates[b]
        if cached is None or cached[0] != key:
            cached = self._templates[b] = (key, self.template(stats, remaining, context))
        return cached[1]

    def propose(self, state: DecodeState) -> TreeProposal:
        trees = [self._template_of(b, left, context) for b, (left, context)
                 in enumerate(zip(state.remaining, state.starts))]
        width = max(len(t) for t in trees)
        parents = [t.parents + [-2] * (width - len(t)) for t in trees]
        ranks = [[max(r, 0) for r in t.ranks] + [0] * (width - len(t)) for t in trees]
        depths = [t.depths + [-1] * (width - len(t)) for t in trees]
        parents_t, ranks_t, depths_t = (
            torch.tensor(rows, dtype=torch.int64).to(state.pending.device, non_blocking=True)
            for rows in (parents, ranks, depths)
        )
        before = _tokens_before(state.contexts, [len(c) - 1 for c in state.contexts],
                                state.pending.device)
        tokens = self.table.walk(state.pending, before, parents_t, ranks_t, depths_t,
                                 max(max(t.depths) for t in trees))
        self._proposal = (tokens, parents, ranks)
        self._nodes_drafted += sum(len(t) - 1 for t in trees)
        self._steps += 1
        return TreeProposal(tokens, parents_t, [max(t.depths) for t in trees])

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        # A request whose template is the root alone drafts nothing, so records nothing: its
        # template, and so its drafting, stays off for the rest of the request (a shorter depth
        # limit only removes nodes). Its table is then never read again.
        drafting = any(kept is None or len(kept[1]) > 1 for kept in self._templates)
        if drafting and outcome.logits is not None and outcome.tokens is not None:
            before = _tokens_before(state.contexts, outcome.previous_starts,
                                    outcome.tokens.device)
            self.table.update(outcome.tokens, outcome.parents, outcome.logits,
                              outcome.accepted_rows, before)
        tokens, parents, ranks = self._proposal
        host = tokens.tolist()  # computed before the step's sync: a copy, no wait
        candidates = [self._trie(*rows) for rows in zip(host, parents, ranks)]
        self._judge.add(state.contexts, outcome.previous_starts, candidates, self._stats)

    def _trie(self, tokens: list, parents: list, ranks: list) -> CandidateTree:
        """The proposed tree as a trie, each node with its rank (for the statistics)."""
        cand = CandidateTree(tokens[0])
        where = [0]
        for j in range(1, len(parents)):
            if parents[j] < 0:
                break
            where.append(cand.propose(where[parents[j]], tokens[j], self.name, ranks[j]))
        return cand

    def select_requests(self, keep: list) -> None:
        self.table.select(keep)
        self._stats = [self._stats[b] for b in keep]
        self._templates = [self._templates[b] for b in keep]
        self._judge.select_requests(keep)

    def report(self) -> dict:
        return {"mean_nodes_drafted": round(self._nodes_drafted / max(self._steps, 1), 2)}


def _tokens_before(contexts: list, roots: list, device) -> Tensor:
    """``[B]`` the token before each request's root (its context position ``roots[b]``;
    ``-1`` at the start of the context), on the device."""
    before = [ctx[at - 1] if at >= 1 else -1 for ctx, at in zip(contexts, roots)]
    return torch.tensor(before, dtype=torch.int64).to(device, non_blocking=True)


class _RankPriorStats(AcceptanceStats):
    """Running acceptance that starts from :data:`RANK_PRIORS`."""

    def prior(self, prophet: str, depth: int, rank: int) -> float:
        row = RANK_PRIORS[min(max(depth, 1), len(RANK_PRIORS)) - 1]
        return row[min(max(rank, 0), len(row) - 1)]


#: A step cost that does not grow with width: every likelier node adds expected tokens at no
#: cost, so :func:`choose_tree` keeps ``max_nodes`` (the template without the cost model).
_FLAT = StepCost({1: 1.0}, source="flat")
