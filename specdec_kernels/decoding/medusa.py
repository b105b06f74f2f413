"""Medusa and blockwise parallel decoding: heads on the target's own final-norm hidden state
propose the next tokens; no draft model runs.

Each step the heads read, through the target-features doorway, the hidden state of the row
whose logits gave the pending token; head ``k`` guesses the token at depth ``k + 1`` of the
block rooted at the pending token.

- :class:`MedusaDrafter` (Cai et al. 2024): a static tree of top-k guesses (node = a path of
  ranks, one per depth), verified in one forward. Greedy requests get the target's greedy
  output; sampling requests draw every node from its head's distribution ``q`` and go through
  lossless recursive rejection sampling (``verify_tree``); ``acceptance="typical"`` asks for
  Medusa's typical acceptance instead (LOSSY when sampling).
- :class:`BlockwiseDrafter` (Stern et al. 2018): the top-1 of each head as a chain.

The tree (and the blockwise chain length) is derived, not copied:
:func:`~specdec_kernels.decoding.budget.choose_tree` takes
each head's rank accuracy (measured on held-out data at training time and saved with the
heads) and the step-cost curve ``c(T)`` (:class:`~specdec_kernels.decoding.cost.StepCost`),
and keeps, through the cost-model budget (:mod:`~specdec_kernels.decoding.budget`), the tree
that maximises expected tokens per unit of step cost.
"""

from __future__ import annotations

import contextlib
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.decoding.cpu_matmul import kernel_linear
from specdec_kernels.decoding.acceptance import LOSSLESS, Typical
from specdec_kernels.decoding.budget import ChainBudgets, choose_tree
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
from specdec_kernels.tree import Tree, tree_from_choices

__all__ = [
    "DEFAULT_HEADS",
    "BlockwiseDrafter",
    "MedusaDrafter",
    "default_heads_path",
    "load_default_heads",
]

#: Package folder of the heads trained for the default model (``specdec train medusa``).
DEFAULT_HEADS = "medusa/smollm2-135m-instruct"

#: Rank accuracy assumed for heads saved without measured accuracies (e.g. FasterDecoding
#: checkpoints): head ``k``'s rank ``r`` guess right with probability ``0.6**(k+1) / (r+1)``.
_PRIOR_DECAY = 0.6

#: Pads head logits outside a draft vocabulary: never drawn, finite for the sampler.
_NEVER = -1e30


def default_heads_path() -> Path:
    """Folder of the shipped heads for the default model."""
    return Path(str(resources.files("specdec_kernels.data").joinpath(DEFAULT_HEADS)))


def load_default_heads():
    from specdec_kernels.medusa.heads import load_heads

    return load_heads(default_heads_path())


# ---------------------------------------------------------------------------- drafters


def _as_heads(heads):
    """``MedusaHeads`` from heads, a folder, or ``None`` (the shipped heads)."""
    from specdec_kernels.medusa.heads import MedusaHeads, load_heads

    if heads is None:
        heads = load_default_heads()
    elif isinstance(heads, (str, Path)):
        heads = load_heads(heads)
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be MedusaHeads, a folder or None, got {type(heads)}")
    return heads


def _given_tree(tree, heads) -> Tree:
    """A tree given by the caller (rank paths or a :class:`Tree` with ranks), checked against
    the block limit and the heads before anything is built on it."""
    if not isinstance(tree, Tree):
        tree = tree_from_choices(tree)
    elif tree.ranks is None:
        raise ValueError("tree: a Medusa tree has ranks (build it with tree_from_choices)")
    if len(tree) > MAX_BLOCK_WIDTH:
        raise ValueError(f"the tree has {len(tree)} nodes; {BLOCK_LIMIT_REASON}")
    if tree.depth > heads.num_heads:
        raise ValueError(f"the tree is {tree.depth} deep; the heads guess {heads.num_heads}")
    return tree


class _HeadsDrafter(Drafter):
    """Shared part of the Medusa and blockwise drafters: heads, their cost, the structure."""

    target_features = "final_norm"
    pausable = True  # reads the engine's features of the last accepted row at each proposal

    def __init__(self, heads=None, *, tree=None, cost_curve=None, max_nodes: int = 64):
        heads = _as_heads(heads)
        check_size("max_nodes", max_nodes, 1, MAX_BLOCK_WIDTH - 1, BLOCK_LIMIT_REASON)
        if tree is not None:
            tree = _given_tree(tree, heads)
        self.heads = heads.eval()
        self.cost_curve = cost_curve
        self.max_nodes = max_nodes
        self._given_tree = tree
        self.tree: Tree | None = None
        self._expected, self._cost_ms = 0.0, 0.0  # what a derived tree was chosen by
        self._lm_head = None
        self._routing, self._projection = contextlib.nullcontext, F.linear  # until bound
        self._head_fraction = 0.0

    def rank_accuracy(self) -> list:
        """Each head's measured rank accuracy (saved at training), or the documented prior."""
        measured = self.heads.info.get("rank_accuracy")
        if measured:
            return [list(row) for row in measured[: self.heads.num_heads]]
        return [[_PRIOR_DECAY ** (k + 1) / (r + 1) for r in range(10)]
                for k in range(self.heads.num_heads)]

    def head_cost_fraction(self, runner) -> float:
        """The heads' cost per step as a fraction of a one-token target step: their weights
        over the target's (a one-token step reads every weight once; so do the heads)."""
        heads = sum(p.numel() for p in self.heads.parameters() if p.dim() > 1)
        if self.heads.projection == "shared":
            heads += self.heads.num_heads * self.heads.hidden_size * self.heads.output_size
        embed = runner.model.get_input_embeddings().weight.numel()
        # Weights at a GGUF file's precision are buffers (QuantizedWeight), not parameters.
        from specdec_kernels.models.quantized_weight import QuantizedWeight

        quantized = sum(b.numel() for b in runner.model.buffers() if isinstance(b, QuantizedWeight))
        target = sum(p.numel() for p in runner.model.parameters()) + quantized - embed
        if runner.model.get_output_embeddings().weight is runner.model.get_input_embeddings().weight:
            target += embed  # tied: the LM head reads the embedding matrix
        return heads / max(target, 1)

    def bind(self, runner, tokenizer) -> None:
        hidden = int(runner.config.hidden_size)
        self.heads.check_target(hidden, runner.vocab_size)
        self.heads.to(device=runner.device, dtype=runner.dtype)
        _, _, self._lm_head = runner.decoder_parts()
        # The heads' linears on the runner's kernels (on CPU the package's small-batch kernel:
        # torch's GEMM packs the weight on every call of 2 to 32 rows, and its rows are not
        # batch-invariant, so a batch would change a request's sampled drafts).
        self._routing = runner.linears(self.heads)
        self._projection = kernel_linear if runner.device.type == "cpu" and runner.cpu_kernels else F.linear
        self._head_fraction = self.head_cost_fraction(runner)
        tree = self._given_tree
        if tree is None:  # derived: no deeper than the heads guess (one accuracy row each)
            curve = runner.step_cost(self.cost_curve)
            tree, self._expected, self._cost_ms = choose_tree(
                self.rank_accuracy(), curve, head_cost_ms=curve(1) * self._head_fraction,
                max_nodes=self.max_nodes, chain=self._chain,
            )
        self.tree = tree
        index = dict(dtype=torch.int64, device=runner.device)
        self._depth_index = torch.tensor([d - 1 for d in tree.depths[1:]], **index)
        self._rank_index = torch.tensor(tree.ranks[1:], **index)
        self._depths = torch.tensor(tree.depths, **index)
        self._parents = torch.tensor(tree.parents, **index)

    def max_block_width(self) -> int:
        return len(self.tree) if self.tree is not None else self.max_nodes + 1

    def describe(self) -> dict:
        out = {"name": self.name, "heads": self.heads.num_heads,
               "projection": self.heads.projection,
               "draft_vocab": self.heads.output_size}
        if self.tree is not None:
            out["tree"] = {
                "nodes": len(self.tree),
                "depth": self.tree.depth,
                "choices": [list(c) for c in self.tree.choices],
                "expected_tokens_per_step": round(self._expected, 4),
                "step_cost_ms": round(self._cost_ms, 3),
            }
            out["head_cost_fraction"] = round(self._head_fraction, 5)
        return out

    def _logits(self, state: DecodeState) -> Tensor:
        """``[B, N, V']`` head logits from the features of each request's last accepted row."""
        with self._routing():
            return self.heads(state.last_features(), self._lm_head, self._projection)

    def _top_ids(self, logits: Tensor, k: int) -> Tensor:
        """``[B, N, k]`` full-vocabulary ids of each head's top-k guesses."""
        top = logits.topk(k, -1).indices
        ids = self.heads.draft_ids
        return ids[top] if ids is not None else top

    def _full_vocab(self, logits: Tensor) -> Tensor:
        """Head logits over the whole vocabulary (float32; outside a draft vocabulary never
        drawn)."""
        logits = logits.float()
        ids = self.heads.draft_ids
        if ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.heads.vocab_size), _NEVER)
        return full.index_copy_(-1, ids, logits)

    def _depth_mask(self, state: DecodeState) -> Tensor:
        """``[B, T]`` nodes each request keeps: no deeper than the tokens it may still emit
        (so a request's tree depends on itself only)."""
        limit = torch.tensor([max(r - 1, 0) for r in state.remaining])
        return self._depths[None, :] <= limit.to(self._depths.device, non_blocking=True)[:, None]


class MedusaDrafter(_HeadsDrafter):
    """Medusa tree decoding.

    Parameters
    ----------
    heads : MedusaHeads, str, Path or None
        The heads, a folder to load them from (this package's format or FasterDecoding's),
        or ``None`` for the heads shipped for the default model.
    tree : list of tuple of int or Tree, optional
        A fixed tree of rank paths; by default derived by :func:`choose_tree` from the heads'
        rank accuracies and ``cost_curve``.
    cost_curve : str, Path, dict or StepCost, optional
        The device's step-cost curve (``bench.cost_curve`` JSON); by default this machine's
        (:meth:`~specdec_kernels.decoding.runner.ModelRunner.step_cost`).
    max_nodes : int
        Most drafted nodes a derived tree may have.
    acceptance : str
        ``"lossless"`` (default): greedy requests verify greedily, sampling ones draw each
        node from its head's distribution and use recursive rejection sampling (exactly the
        target's distribution). ``"typical"``: nodes are the top-k guesses and the target
        accepts a node when ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))``
        (Medusa's typical acceptance; LOSSY when sampling, greedy requests unchanged).
    posterior_threshold, posterior_alpha : float
        Typical acceptance's ``epsilon`` and ``alpha``: Medusa's defaults 0.09 and 0.3 (its
        ``medusa_generate``; the reference repo's ``utils.evaluate_posterior`` has the two
        defaults the other way round).
    """

    name = "medusa"
    _chain = False

    def __init__(
        self,
        heads=None,
        *,
        tree=None,
        cost_curve=None,
        max_nodes: int = 64,
        acceptance: str = "lossless",
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
    ):
        super().__init__(heads, tree=tree, cost_curve=cost_curve, max_nodes=max_nodes)
        if acceptance not in ("lossless", "typical"):
            raise ValueError(f"acceptance must be 'lossless' or 'typical', got {acceptance!r}")
        if not 0 < posterior_threshold <= 1 or not 0 < posterior_alpha <= 1:
            raise ValueError(
                f"posterior_threshold and posterior_alpha must be in (0, 1], got "
                f"{posterior_threshold}, {posterior_alpha}"
            )
        self.acceptance = acceptance
        self.rule = LOSSLESS
        if acceptance == "typical":
            self.rule = Typical(float(posterior_threshold), float(posterior_alpha))

    def describe(self) -> dict:
        out = super().describe()
        out["acceptance"] = self.acceptance
        if self.acceptance == "typical":
            out["posterior_threshold"] = self.rule.posterior_threshold
            out["posterior_alpha"] = self.rule.posterior_alpha
        return out

    def propose(self, state: DecodeState) -> TreeProposal:
        batch, size = state.batch, len(self.tree)
        logits = self._logits(state)
        probs = None
        if state.greedy or self.acceptance == "typical":
            top = self._top_ids(logits, max(self.tree.ranks) + 1)  # [B, N, k]
            drafts = top[:, self._depth_index, self._rank_index]  # [B, T - 1]
        else:
            # Every node is an independent draw from its head's processed distribution q.
            rows = self._full_vocab(logits)[:, self._depth_index]  # [B, T - 1, V]
            index = torch.arange(batch, device=rows.device).repeat_interleave(size - 1)
            params = state.draft_params.select(index)
            offsets = (state.offsets[:, None] + torch.arange(1, size, device=rows.device))
            drafts, q = ops.sample_with_probs(
                rows.reshape(batch * (size - 1), -1), params, offsets.reshape(-1)
            )
            drafts = drafts.view(batch, size - 1)
            probs = torch.cat([q.new_zeros(batch, 1, q.shape[-1]), q.view(batch, size - 1, -1)], 1)
        tokens = torch.cat([state.pending[:, None], drafts], 1)
        keep = self._depth_mask(state)
        parents = torch.where(keep, self._parents[None, :], torch.full_like(tokens, -2))
        tokens = torch.where(keep, tokens, torch.zeros_like(tokens))
        depths = [min(self.tree.depth, max(r - 1, 0)) for r in state.remaining]
        return TreeProposal(tokens, parents, depths, probs, acceptance=self.rule)


class BlockwiseDrafter(_HeadsDrafter):
    """Blockwise parallel decoding: each head's top guess, as a chain verified in one forward
    (lossless for greedy and sampling requests alike: fixed drafts, one-hot q).

    Parameters
    ----------
    heads, cost_curve, max_nodes
        As in :class:`MedusaDrafter`; the chain's length is derived the same way (rank-0
        guesses only), at most the number of heads.
    num_draft : int, optional
        A fixed chain length instead.
    budget : bool
        Let each request's :class:`~specdec_kernels.decoding.budget.ChainBudget` shorten its
        chain from the acceptance it measures, to none (and no heads run) while the guesses
        do not pay for their verification rows; ``False``: the length above every step.
    """

    name = "blockwise"
    _chain = True

    def __init__(self, heads=None, *, num_draft: int | None = None, cost_curve=None,
                 max_nodes: int = 64, budget: bool = True):
        heads, tree = _as_heads(heads), None
        if num_draft is not None:  # checked before the chain is built
            check_size("num_draft", num_draft, 1, heads.num_heads,
                       f"the heads guess {heads.num_heads} tokens ahead")
            tree = [(0,) * d for d in range(1, num_draft + 1)]
        super().__init__(heads, tree=tree, cost_curve=cost_curve, max_nodes=max_nodes)
        self.budget = budget
        self._budgets = None  # ChainBudgets of the run, when the budget is on
        self._chain_depths: list = []

    def describe(self) -> dict:
        return dict(super().describe(), budget=self.budget)

    def report(self) -> dict:
        return {} if self._budgets is None else {"budget": self._budgets.report()}

    def start(self, state: DecodeState) -> None:
        self._budgets = None
        if self.budget:
            # The heads' cost is paid on every step that drafts, whatever its length: only
            # the verification rows are weighed (the prior: head 0's measured top-1).
            prior = min(max(self.rank_accuracy()[0][0], 0.01), 0.99)
            self._budgets = ChainBudgets(state.batch, state.runner.step_cost(self.cost_curve),
                                         None, first_draft_prior=prior)

    def select_requests(self, keep: list) -> None:
        if self._budgets is not None:
            self._budgets.select_requests(keep)

    def propose(self, state: DecodeState) -> ChainProposal:
        depths = [min(self.tree.depth, max(r - 1, 0)) for r in state.remaining]
        if self._budgets is not None:
            depths = self._budgets.lengths(depths, state.starts)
        self._chain_depths = depths
        k = max(depths)
        if k == 0:  # no request drafts: the heads do not run
            empty = state.pending.new_zeros((state.batch, 0))
            return ChainProposal(empty, state.pending.new_zeros(state.batch), depths)
        top = self._top_ids(self._logits(state), 1)[:, :k, 0].contiguous()  # [B, K]
        num_draft = torch.tensor(depths, dtype=torch.int64).to(top.device, non_blocking=True)
        return ChainProposal(top, num_draft, depths)

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        if self._budgets is not None:
            self._budgets.record(self._chain_depths, outcome.num_accepted)
