"""Token recycling (Luo et al., 2024): every verification forward ranks, at every row of the
block, the whole vocabulary as the next token, and verification uses one token of it. The
rest is kept: per request, a successor table holds for every vocabulary token the top-``k``
tokens the target last ranked after it, and the next draft is a tree walked through the table
from the pending token. No model runs for drafting and nothing is trained.

The successor table
-------------------
``[V + 1, k]`` int32 per request, on the model's device (row ``V`` takes the writes that are
thrown away). After each step the top-``k`` of every verified row's logits
(:attr:`~specdec_kernels.decoding.drafter.StepOutcome.logits`, from the step's own forward:
no extra forward and no device read) replace the row of the token that block row held,
rejected branches included: what the target expected after a token in a context that was
not taken is still a good guess for the next time that token comes. Where one token held
several rows, the accepted path's (the real context) wins, then the later row. A request's
table starts from its prompt: the tokens that followed each prompt token there, most recent
first, then the prompt's most frequent tokens (also the whole row of tokens the prompt lacks).

Per request, not shared across the batch: a shared table would make a request's drafts, and
so its sampled output, depend on the other requests (measured in bench/RESULTS.md: sharing
the table across requests one after another, the paper's warm start, does not pay for that).

Drafting
--------
The tree is a template of rank paths: node ``(r1, .., rd)`` holds
``table[table[..table[pending][r1]..]][rd]``, gathered level by level on the device. Each
request's template is the cost model's choice
(:func:`~specdec_kernels.decoding.medusa.choose_tree`: the rank-path tree that maximises
expected tokens per unit of the step cost ``c(T)``), scored by that request's own running
acceptance by depth and rank (:class:`~specdec_kernels.decoding.budget.AcceptanceStats`): the
tree grows as its drafts hold and shrinks when they fail, sized as if the request ran alone so
that the batch never changes it.

Drafts are one-hot (``probs=None``): sampling goes through the lossless tree rule
(:func:`~specdec_kernels.ops.verify_tree`), greedy decoding gives the target's own output.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from specdec_kernels.decoding.budget import AcceptanceStats
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding.drafter import DecodeState, Drafter, StepOutcome, TreeProposal
from specdec_kernels.decoding.medusa import choose_tree
from specdec_kernels.decoding.multi import CandidateTree, OutcomeJudge

__all__ = ["FIRST_DRAFT_PRIOR", "SuccessorTable", "TokenRecyclingDrafter"]

#: P(the top successor of the pending token is the next token) before a request has
#: evidence of its own; measured on the default model (generic requests, not the benchmark
#: prompts; see bench/RESULTS.md). Deeper and lower-ranked nodes start lower
#: (:class:`~specdec_kernels.decoding.budget.AcceptanceStats`), and a few steps of evidence
#: replace it.
FIRST_DRAFT_PRIOR = 0.45


class SuccessorTable:
    """Per request, every vocabulary token's latest top-``k`` successors, on the device.

    Parameters
    ----------
    vocab_size : int
        ``V``; token ids are in ``[0, V)``.
    k : int
        Successors kept per token.
    device : torch.device
    """

    def __init__(self, vocab_size: int, k: int, device):
        self.vocab_size, self.k, self.device = vocab_size, k, torch.device(device)
        self.table = torch.zeros(0, vocab_size + 1, k, dtype=torch.int32, device=self.device)

    @property
    def batch(self) -> int:
        return self.table.shape[0]

    def start(self, prompts: list) -> None:
        """One table per prompt, filled from the prompt (see the module notes)."""
        self.table = torch.empty(
            len(prompts), self.vocab_size + 1, self.k, dtype=torch.int32, device=self.device
        )
        for b, prompt in enumerate(prompts):
            fallback, rows = prompt_successors(prompt, self.k, self.vocab_size)
            self.table[b] = torch.tensor(fallback, dtype=torch.int32).to(self.device)
            if rows:
                index = torch.tensor(list(rows), dtype=torch.int64).to(self.device)
                values = torch.tensor(list(rows.values()), dtype=torch.int32)
                self.table[b, index] = values.to(self.device)

    def update(self, tokens: Tensor, logits: Tensor, accepted_rows: Tensor | None) -> None:
        """Write the top-``k`` of every row's logits to the row of the token it held.

        Parameters
        ----------
        tokens : Tensor
            ``[B, T]`` int64 token of each block row (``-1``: unused row, skipped).
        logits : Tensor
            ``[B, >= T, V]`` the target's logits (row ``j`` predicts the token after row ``j``).
        accepted_rows : Tensor, optional
            ``[B, W]`` int64 rows of the accepted path (``-1`` padding): among rows holding the
            same token these win, then the later row.
        """
        batch, width = tokens.shape
        top = logits[:, :width].topk(self.k, dim=-1).indices.to(torch.int32)
        order = torch.arange(width, device=tokens.device).expand(batch, width)
        if accepted_rows is not None:
            hits = torch.zeros_like(tokens).scatter_add_(
                1, accepted_rows.clamp(min=0), (accepted_rows >= 0).to(tokens.dtype)
            )
            order = order + width * (hits > 0)
        same = tokens[:, :, None] == tokens[:, None, :]
        beaten = (same & (order[:, None, :] > order[:, :, None])).any(2)
        rows = torch.where((tokens >= 0) & ~beaten, tokens, self.vocab_size)
        batch_index = torch.arange(batch, device=tokens.device)[:, None]
        self.table[batch_index, rows] = top

    def walk(self, roots: Tensor, parents: Tensor, ranks: Tensor, depths: Tensor) -> Tensor:
        """Tokens of a rank-path tree per request, level by level on the device.

        Parameters
        ----------
        roots : Tensor
            ``[B]`` int64 pending tokens.
        parents, ranks, depths : Tensor
            ``[B, T]`` int64 per node (node 0 the root; padding nodes have depth ``-1``).

        Returns
        -------
        Tensor
            ``[B, T]`` int64 node tokens (the root's on padding nodes).
        """
        batch, width = parents.shape
        tokens = roots[:, None].expand(batch, width).contiguous()
        batch_index = torch.arange(batch, device=roots.device)[:, None]
        for depth in range(1, int(depths.max()) + 1):
            above = tokens.gather(1, parents.clamp(min=0))
            guess = self.table[batch_index, above, ranks.clamp(min=0)].to(torch.int64)
            tokens = torch.where(depths == depth, guess, tokens)
        return tokens

    def select(self, keep: list) -> None:
        index = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.table = self.table.index_select(0, index)


def prompt_successors(prompt: list, k: int, vocab_size: int) -> tuple:
    """A request's starting rows: ``(fallback, rows)`` where ``fallback`` is the prompt's
    ``k`` most frequent tokens (padded with the smallest other ids) and ``rows[v]`` the
    distinct tokens that followed ``v`` in the prompt, most recent first, completed with the
    fallback (``k`` distinct ids each)."""
    frequent = [t for t, _ in Counter(prompt).most_common(k)]
    fill = iter(t for t in range(vocab_size) if t not in frequent)
    fallback = frequent + [next(fill) for _ in range(k - len(frequent))]
    after: dict = {}
    for i in range(len(prompt) - 1, 0, -1):
        seen = after.setdefault(prompt[i - 1], [])
        if len(seen) < k and prompt[i] not in seen:
            seen.append(prompt[i])
    rows = {}
    for token, seen in after.items():
        rows[token] = (seen + [t for t in fallback if t not in seen])[:k]
    return fallback, rows


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
        The step cost ``c(T)`` that sizes the tree (the shipped CPU curve by default).
    budget : bool
        Size each request's tree with the cost model and its running acceptance (default);
        ``False`` proposes the ``max_nodes`` most likely nodes (e.g. when a
        :class:`~specdec_kernels.decoding.multi.MultiDrafter` budgets the merged tree).

    Raises
    ------
    ValueError
        Sizes below 1.
    """

    name = "token-recycling"

    def __init__(self, *, successors: int = 8, max_nodes: int = 32, max_depth: int = 8,
                 cost_curve=None, budget: bool = True):
        if min(successors, max_nodes, max_depth) < 1:
            raise ValueError(
                "successors, max_nodes and max_depth must be >= 1, got "
                f"{successors}, {max_nodes}, {max_depth}"
            )
        self.k, self.max_nodes, self.max_depth = successors, max_nodes, max_depth
        self.cost_curve = cost_curve
        self.use_budget = budget
        self.step_cost: StepCost | None = None
        self.table: SuccessorTable | None = None
        self._stats: list = []
        self._judge = OutcomeJudge(0)
        self._proposal = None
        self._nodes_drafted = 0
        self._steps = 0

    def bind(self, runner, tokenizer) -> None:
        if self.k > runner.vocab_size:
            raise ValueError(
                f"successors: {self.k} exceeds the vocabulary of {runner.vocab_size} tokens"
            )
        self.step_cost = StepCost.load(self.cost_curve)
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
        self._judge = OutcomeJudge(state.batch)
        self._nodes_drafted = self._steps = 0

    def _new_stats(self) -> AcceptanceStats:
        return AcceptanceStats(priors={self.name: FIRST_DRAFT_PRIOR}, max_depth=self.max_depth,
                               max_rank=self.k - 1)

    def template(self, stats: AcceptanceStats, remaining: int):
        """A request's rank-path tree (:class:`~specdec_kernels.decoding.medusa.TreeChoice`)
        from its acceptance so far: cost-optimal, or the ``max_nodes`` likeliest nodes."""
        depth = min(self.max_depth, max(remaining - 1, 0))
        rates = [[stats.rate(self.name, d, r) for r in range(self.k)] for d in range(1, depth + 1)]
        cost = self.step_cost if self.use_budget else _FLAT
        return choose_tree(rates, cost, max_nodes=self.max_nodes)

    def propose(self, state: DecodeState) -> TreeProposal:
        trees = [self.template(s, left) for s, left in zip(self._stats, state.remaining)]
        width = max(t.size for t in trees)
        parents = [t.parents + [-2] * (width - t.size) for t in trees]
        ranks = [[0] + t.ranks + [0] * (width - t.size) for t in trees]
        depths = [[0] + t.depths + [-1] * (width - t.size) for t in trees]
        device = state.pending.device
        as_device = lambda rows: torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)  # noqa: E731
        parents_t = as_device(parents)
        tokens = self.table.walk(state.pending, parents_t, as_device(ranks), as_device(depths))
        self._proposal = (tokens, parents, ranks)
        self._nodes_drafted += sum(t.size - 1 for t in trees)
        self._steps += 1
        return TreeProposal(tokens, parents_t, [t.depth for t in trees])

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        if outcome.logits is not None and outcome.tokens is not None:
            self.table.update(outcome.tokens, outcome.logits, outcome.accepted_rows)
        tokens, parents, ranks = self._proposal
        host = tokens.tolist()  # computed before the step's sync: a copy, no wait
        candidates = [self._trie(*rows) for rows in zip(host, parents, ranks)]
        self._judge.add(state, outcome, candidates, self._stats)

    def _trie(self, tokens: list, parents: list, ranks: list) -> CandidateTree:
        """The proposed tree as a trie, each node with its rank (for the statistics)."""
        cand = CandidateTree(tokens[0])
        where = [0]
        for j in range(1, len(parents)):
            if parents[j] < 0:
                break
            where.append(cand.add(where[parents[j]], tokens[j], self.name, ranks[j]))
        return cand

    def select_requests(self, keep: list) -> None:
        self.table.select(keep)
        self._stats = [self._stats[b] for b in keep]
        self._judge.select_requests(keep)

    def report(self) -> dict:
        return {"mean_nodes_drafted": round(self._nodes_drafted / max(self._steps, 1), 2)}


class _Flat:
    """A step cost that falls with width: :func:`choose_tree` then keeps ``max_nodes``."""

    source = "flat"

    def __call__(self, width: float) -> float:
        return 1.0 / (1.0 + width)


_FLAT = _Flat()
