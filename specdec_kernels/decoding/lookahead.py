"""Lookahead decoding (Fu et al., 2024) and plain Jacobi decoding (Santilli et al., 2023) as
drafters: no draft model, no training.

**Jacobi decoding** guesses the next ``K`` tokens, runs them all in one forward and keeps the
longest prefix that reproduces itself (chain verification); the forward's outputs after that
prefix are the next guesses. :class:`JacobiDrafter` is exactly that: its guesses are the
verified chain, and it reads the chain's logits back from the step
(:attr:`~specdec_kernels.decoding.drafter.StepOutcome.logits`).

**Lookahead decoding** keeps a 2-D window of Jacobi guesses, ``W`` columns by ``N - 1``
levels, and runs it in the same forward as verification as extra rows
(:class:`~specdec_kernels.decoding.drafter.ExtraRows`, masks and positions from
:func:`specdec_kernels.ops.build_lookahead_masks`). Cell ``(l, i)`` guesses the token
``i + l`` positions after the pending token (cell ``(0, 0)`` is the pending token itself) and
attends to ``(0, 0..i)`` then ``(1..l, i)``. Each step:

1. the top level's outputs ``O[i]`` (one per column, sampled with the request's own sampling
   parameters and draft random stream, or the argmax when greedy) complete one ``N``-gram per
   column: ``(0, i), (1, i), ..., (N - 2, i), O[i]``, a trajectory of consecutive positions.
   The n-grams go into a pool keyed by their first token (at most ``G`` per key, the newest
   kept; optionally seeded with the prompt's and the output's own n-grams);
2. the window slides one position: level ``l`` takes level ``l + 1``'s guesses and the top
   level takes ``O`` (during the first ``N - 2`` steps, the warm-up, the levels fill up
   instead);
3. up to ``G`` pool n-grams that start with the pending token are merged by common prefix into
   a trie rooted at it: the verification tree of the next step. Verification is the usual
   :func:`~specdec_kernels.ops.verify_tree` with one-hot drafts, so greedy output is the
   target's own and sampled output has exactly its distribution.

All state is per request (windows, pools, random fills), so batches with ragged acceptance
work and a request's output does not depend on the rest of its batch.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.decoding.budget import ChainBudgets
from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    ChainProposal,
    DecodeState,
    Drafter,
    ExtraRows,
    StepOutcome,
    TreeProposal,
    check_size,
)
from specdec_kernels.tree import stack_trees, tree_from_sequences

__all__ = ["DEFAULTS", "JacobiDrafter", "LookaheadDrafter", "NgramPool"]

#: Default (W, N, G) per device type: what ``bench.lookahead_defaults select`` picks from the
#: committed acceptance table (``bench/results/*/lookahead-acceptance.json``, measured on the
#: default model) and the device's step-cost curve (CPU: the shipped one,
#: :data:`~specdec_kernels.decoding.cost.DEFAULT_CURVE`); ``python_tests/test_lookahead_defaults.py``
#: re-derives them, so they change with the curve, never by hand. Other device types use
#: the CPU's.
DEFAULTS = {
    "cpu": {"window": 2, "ngram": 3, "max_candidates": 2},
    "cuda": {"window": 15, "ngram": 5, "max_candidates": 15},
}


class NgramPool:
    """N-grams keyed by their first token, at most ``capacity`` per key, the newest kept.

    ``candidates(key)`` lists a key's continuations (``N - 1`` tokens each), newest first.
    Adding an n-gram already present makes it the newest.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._table: dict = {}

    def add(self, key: int, continuation: tuple) -> None:
        if self.capacity <= 0:
            return
        entries = self._table.setdefault(key, [])
        if continuation in entries:
            entries.remove(continuation)
        elif len(entries) >= self.capacity:
            del entries[0]
        entries.append(continuation)

    def add_sequence(self, tokens: list, n: int, start: int = 0) -> None:
        """Every n-gram of ``tokens`` that begins at or after ``start``."""
        for j in range(max(start, 0), len(tokens) - n + 1):
            self.add(tokens[j], tuple(tokens[j + 1 : j + n]))

    def candidates(self, key: int) -> list:
        return list(reversed(self._table.get(key, ())))

    def __len__(self) -> int:
        return sum(len(v) for v in self._table.values())


class _Fill:
    """Random guesses copied from a request's own context (deterministic per prompt, so a
    request's guesses never depend on its batch)."""

    def __init__(self, prompt: list):
        self.rng = random.Random(hash(tuple(prompt)) & 0xFFFFFFFF)

    def __call__(self, context: list, count: int) -> list:
        return [context[self.rng.randrange(len(context))] for _ in range(count)]


def _draw(logits: Tensor, state: DecodeState) -> list:
    """One token per row of ``[B, C, V]`` logits, from each request's draft random stream
    (row ``c`` at offset ``offsets[b] + c``) with its own sampling parameters; the argmax
    when greedy. Returns ``B`` host lists of ``C`` tokens."""
    batch, columns, vocab = logits.shape
    if columns == 0:
        return [[] for _ in range(batch)]
    flat = logits.reshape(batch * columns, vocab).contiguous()
    if state.greedy:
        tokens = flat.argmax(-1)  # what sampling at temperature 0 returns (first maximum)
    else:
        offsets = state.offsets[:, None] + torch.arange(columns, device=logits.device)
        params = state.draft_params.repeat_interleave(columns)
        tokens = ops.sample(flat, params, offsets.reshape(-1))
    return tokens.view(batch, columns).tolist()


class LookaheadDrafter(Drafter):
    """Lookahead decoding: a window of Jacobi guesses run beside a trie of pool n-grams.

    Parameters
    ----------
    window : int
        ``W >= 1``: columns of the window (n-grams collected per step).
    ngram : int
        ``N >= 2``: n-gram size; the window has ``N - 1`` levels and verified candidates are
        ``N - 1`` tokens deep.
    max_candidates : int
        ``G >= 0``: pool n-grams kept per first token, all verified when their key is the
        pending token (0: the window runs but nothing is verified).
    prompt_ngrams : bool
        Seed the pool with the prompt's n-grams and add the output's as it grows.

    ``W``, ``N`` and ``G`` left out take :data:`DEFAULTS` for the target's device type. The
    block of a step is ``1 + G (N - 1)`` tree nodes at most plus ``W (N - 1) - 1`` window
    rows.
    """

    name = "lookahead"

    def __init__(
        self,
        window: int | None = None,
        ngram: int | None = None,
        max_candidates: int | None = None,
        *,
        prompt_ngrams: bool = True,
    ):
        self._given = {"window": window, "ngram": ngram, "max_candidates": max_candidates}
        for (name, value), low in zip(self._given.items(), (1, 2, 0)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < low
            ):
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self._use_defaults("cpu")
        self.prompt_ngrams = prompt_ngrams
        self._requests: list = []
        self._levels = 1
        self._mask_cache: dict = {}

    def _use_defaults(self, device_type: str) -> None:
        defaults = DEFAULTS.get(device_type, DEFAULTS["cpu"])
        settings = {k: defaults[k] if v is None else v for k, v in self._given.items()}
        self.window, self.ngram = settings["window"], settings["ngram"]
        self.max_candidates = settings["max_candidates"]
        if self.max_block_width() > MAX_BLOCK_WIDTH:
            raise ValueError(
                f"window={self.window}, ngram={self.ngram}, max_candidates="
                f"{self.max_candidates} make blocks of (window + max_candidates) * (ngram - 1)"
                f" = {self.max_block_width()} tokens; {BLOCK_LIMIT_REASON}"
            )

    def bind(self, runner, tokenizer) -> None:
        self._use_defaults(runner.device.type)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "window": self.window,
            "ngram": self.ngram,
            "max_candidates": self.max_candidates,
            "prompt_ngrams": self.prompt_ngrams,
        }

    def max_block_width(self) -> int:
        return (self.max_candidates + self.window) * (self.ngram - 1)

    # ------------------------------------------------------------------ state

    def start(self, state: DecodeState) -> None:
        self._levels = 1
        self._requests = []
        for context in state.contexts:
            fill = _Fill(context)
            pool = NgramPool(self.max_candidates)
            if self.prompt_ngrams:
                pool.add_sequence(context, self.ngram)
            # Level 0: the pending token (column 0, set every step), then W - 1 guesses.
            levels = [[context[-1]] + fill(context, self.window - 1)]
            self._requests.append(
                {"fill": fill, "pool": pool, "levels": levels, "indexed": len(context)}
            )

    def select_requests(self, keep: list) -> None:
        self._requests = [self._requests[b] for b in keep]

    # ------------------------------------------------------------------ proposing

    def _window_masks(self, batch: int, nodes: int, device) -> ops.LookaheadMasks:
        rows = self.window * self._levels - 1
        key = (batch, nodes, self._levels, str(device))
        masks = self._mask_cache.get(key)
        if masks is None:
            sizes = torch.full((batch,), self.window, dtype=torch.int64, device=device)
            levels = torch.full((batch,), self._levels, dtype=torch.int64, device=device)
            masks = ops.build_lookahead_masks(sizes, levels, nodes, rows)
            if len(self._mask_cache) > 64:
                self._mask_cache.clear()
            self._mask_cache[key] = masks
        return masks

    def propose(self, state: DecodeState) -> TreeProposal:
        depth = self.ngram - 1
        trees, depths, window_tokens = [], [], []
        for b, request in enumerate(self._requests):
            root = state.contexts[b][-1]
            request["levels"][0][0] = root
            limit = min(depth, state.remaining[b] - 1)
            sequences = []
            if limit > 0:
                sequences = [c[:limit] for c in request["pool"].candidates(root)]
            trees.append(tree_from_sequences(
                sequences, root, max_nodes=1 + self.max_candidates * depth, max_depth=depth
            ))
            depths.append(max((len(s) for s in sequences), default=0))
            levels = request["levels"]
            window_tokens.append(levels[0][1:] + [t for level in levels[1:] for t in level])
        device = state.pending.device
        tokens, parents = stack_trees(trees)
        tokens = tokens.to(device, non_blocking=True)
        parents = parents.to(device, non_blocking=True)
        extra = None
        if self.window * self._levels > 1:
            masks = self._window_masks(state.batch, tokens.shape[1], device)
            rows = torch.tensor(window_tokens, dtype=torch.int64).to(device, non_blocking=True)
            extra = ExtraRows(rows, masks.positions, masks.packed_mask)
        return TreeProposal(tokens, parents, depths, extra=extra)

    # ------------------------------------------------------------------ updating

    def _top_rows(self, tree_width: int, device) -> Tensor:
        """Block rows of the window's top level, one per column."""
        top, width = self._levels - 1, self.window
        rows = [tree_width + top * width + i - 1 for i in range(width)]
        if top == 0:
            rows[0] = 0  # cell (0, 0) is the root, tree node 0
        return torch.tensor(rows, dtype=torch.int64, device=device)

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        logits = outcome.logits
        top = logits.index_select(1, self._top_rows(outcome.tree_width, logits.device))
        outputs = _draw(top, state)
        full = self._levels == self.ngram - 1
        for b, request in enumerate(self._requests):
            levels, out = request["levels"], outputs[b]
            if full:  # one n-gram per column: (0, i), (1, i), ..., (N - 2, i), O[i]
                for i in range(self.window):
                    continuation = tuple(level[i] for level in levels[1:]) + (out[i],)
                    request["pool"].add(levels[0][i], continuation)
            self._slide(request, out, state.contexts[b], full)
            if self.prompt_ngrams:
                context = state.contexts[b]
                request["pool"].add_sequence(context, self.ngram, request["indexed"] - self.ngram + 1)
                request["indexed"] = len(context)
        if not full:
            self._levels += 1

    def _slide(self, request: dict, out: list, context: list, full: bool) -> None:
        """Move the window one position on (the next step's root is one position later)."""
        levels = request["levels"]
        if full:
            # Level l takes level l + 1's guesses (same absolute positions), the top takes O;
            # the new level 0's column 0 becomes the next pending token.
            levels[:] = levels[1:] + [list(out)]
            return
        # Warm-up: keep every level, add O on top, and shift columns left (cell (l, i + 1)
        # becomes (l, i)); the last column gets fresh guesses copied from the context.
        levels.append(list(out))
        fresh = request["fill"](context, len(levels))
        for level, token in zip(levels, fresh):
            level[:] = level[1:] + [token]


class JacobiDrafter(Drafter):
    """Plain Jacobi decoding: ``K`` guesses verified as a chain; the step's own outputs after
    the accepted prefix are the next guesses (padded with tokens copied from the context).

    Parameters
    ----------
    num_guesses : int
        ``K >= 1`` tokens guessed (and verified) at most per step.
    budget : bool
        Let the cost model verify fewer guesses, none while they do not pay
        (:class:`~specdec_kernels.decoding.budget.ChainBudget`: guesses cost nothing to make,
        only their rows of the verification forward); ``False``: ``K`` every step.
    cost_curve : str, Path, dict, StepCost, optional
        ``c(T)`` of the target (see :meth:`~specdec_kernels.decoding.cost.StepCost.load`);
        default: this machine's.
    """

    name = "jacobi"
    #: Guesses of a model not trained for Jacobi decoding are rarely right: on the default
    #: model's dev prompts 1-2% of first guesses were accepted in every session's benchmark.
    #: Evidence replaces it within a few steps on a model trained for it (CLLMs).
    first_draft_prior = 0.05

    def __init__(self, num_guesses: int = 4, *, budget: bool = True, cost_curve=None):
        self.num_guesses = check_size("num_guesses", num_guesses, 1, MAX_BLOCK_WIDTH - 1,
                                      BLOCK_LIMIT_REASON)
        self.budget = budget
        self.cost_curve = cost_curve
        self._budgets = None  # ChainBudgets of the run, when the budget is on
        self._depths: list = []
        self._guesses: list = []
        self._fills: list = []

    def describe(self) -> dict:
        return {"name": self.name, "num_guesses": self.num_guesses, "budget": self.budget}

    def report(self) -> dict:
        return {} if self._budgets is None else {"budget": self._budgets.report()}

    def max_block_width(self) -> int:
        return self.num_guesses + 1

    def start(self, state: DecodeState) -> None:
        self._fills = [_Fill(c) for c in state.contexts]
        self._guesses = [f(c, self.num_guesses) for f, c in zip(self._fills, state.contexts)]
        self._budgets = None
        if self.budget:
            self._budgets = ChainBudgets(state.batch, state.runner.step_cost(self.cost_curve),
                                         None, first_draft_prior=self.first_draft_prior)

    def select_requests(self, keep: list) -> None:
        if self._budgets is not None:
            self._budgets.select_requests(keep)
        self._guesses = [self._guesses[b] for b in keep]
        self._fills = [self._fills[b] for b in keep]

    def propose(self, state: DecodeState) -> ChainProposal:
        device = state.pending.device
        # Each request's budget may cut its own chain (its output never depends on its batch).
        self._depths = [max(0, min(self.num_guesses, r - 1)) for r in state.remaining]
        if self._budgets is not None:
            self._depths = self._budgets.lengths(self._depths, state.starts)
        k = max(self._depths)
        guesses = [g[:k] for g in self._guesses]
        tokens = torch.tensor(guesses, dtype=torch.int64).reshape(state.batch, k)
        num_draft = torch.tensor(self._depths, dtype=torch.int64).to(device, non_blocking=True)
        return ChainProposal(tokens.to(device, non_blocking=True), num_draft, self._depths)

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        if self._budgets is not None:
            self._budgets.record(self._depths, outcome.num_accepted)
        # Row j predicts the token after block row j; past the accepted prefix n, rows
        # n + 1 .. k guess the positions after the new pending token.
        outputs = _draw(outcome.logits, state)
        for b, n in enumerate(outcome.num_accepted):
            guesses = outputs[b][n + 1 :]
            missing = self.num_guesses - len(guesses)
            self._guesses[b] = guesses + self._fills[b](state.contexts[b], missing)
