"""EAGLE-3 drafting with an EAGLE-2 dynamic tree, on the target's own features.

Each step:

1. **Catch-up.** The target features of the rows the last forward accepted (all prompt rows
   after the prefill) arrive through the target-features doorway (low, middle and high decoder
   layers, ``prompt_rows="all"``); the draft network runs over them, fused with the embedding
   of the token after each row, and *commits* their keys and values to its own cache: the
   draft's cache always holds exactly one row per committed target row, computed from the
   target's features. Its last row's output gives the pending token's children.
2. **Expansion** (EAGLE-2). Depth by depth, the ``top_k`` most promising nodes of the newest
   depth run through the draft as one tree block (each attends to the committed prefix and its
   own ancestors) and get ``top_k`` children each; the rows written for them sit past the
   committed length and are never committed, so the next catch-up overwrites them (the
   rollback: after any rejection the cache equals a fresh prefill over the accepted context).
   Expansion stops when the next depth's expected tokens, less the verification cost of the
   nodes that carry them, are worth less than an expansion (all measured: the draft forward
   with its head and bookkeeping, not the forward alone, which made the shipped drafter run
   3.2 forwards a step where 2.1 gave the same tokens per step), or at ``max_depth``.
3. **Budget.** Every node's chance of acceptance is its draft probability mapped through the
   *measured* acceptance of nodes of that probability and depth (running
   :class:`~specdec_kernels.decoding.budget.AcceptanceStats`, the draft's own probability as
   the prior); :class:`~specdec_kernels.decoding.budget.TreeBudget` keeps the nodes that
   maximise expected tokens per unit of the device's measured step cost ``c(T)`` plus the
   measured drafting time.

Greedy batches expand by the draft's argmax ranks. When any request samples, every node's
children are drawn from the draft's ``q`` (temperature-scaled like the target) without
replacement, and each is handed to :func:`~specdec_kernels.ops.verify_tree` with the
distribution it was drawn from (lossless recursive rejection sampling); which nodes run and
which are kept never depends on a node's own draw (only on its depth and sibling rank and on
its ancestors: paths are valued by the measured acceptance of sampled nodes, not by ``q``),
which keeps every sibling set a sample of that process.
"""

from __future__ import annotations

import copy
import time
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.decoding.budget import AcceptanceStats, TreeBudget
from specdec_kernels.decoding.cpu_matmul import KernelWeight
from specdec_kernels.models.quantized_weight import QuantizedWeight, joined_rows, quantize_model
from specdec_kernels.decoding.drafter import DecodeState, Drafter, StepOutcome, TreeProposal
from specdec_kernels.eagle.model import EagleDraftModel, load_eagle, rope_tables
from specdec_kernels.decoding.runner import FeatureSpec

__all__ = ["DEFAULT_EAGLE", "EagleDrafter", "default_eagle_path"]

#: Package folder of the drafter trained for the default model (``specdec train eagle``).
DEFAULT_EAGLE = "eagle/smollm2-135m-instruct"

#: Draft-probability buckets of the acceptance statistics (upper edges).
_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.01)


def default_eagle_path() -> Path:
    """Folder of the shipped EAGLE drafter for the default model."""
    return Path(str(resources.files("specdec_kernels.data").joinpath(DEFAULT_EAGLE)))


class _JoinedLinear:
    """Bias-free linears that read one input, as one ``[sum N, K]`` weight: one call instead
    of several. The joined rows are a copy, remade when any member's weight is replaced or
    changed in place; they are seen through :class:`~specdec_kernels.decoding.cpu_matmul.KernelWeight`,
    so the runner's routing (:meth:`~specdec_kernels.decoding.runner.ModelRunner.linears`)
    applies to them as to the members: on the small-batch kernel every output column is the
    bits of its own linear's."""

    def __init__(self, *linears):
        self.linears = linears
        self.sizes = [m.out_features for m in linears]
        self._key, self._joined = None, None

    @staticmethod
    def _plain(linear) -> Tensor:
        weight = linear._parameters.get("weight")
        if weight is None:  # int8 weights are buffers (QuantizedWeight)
            return linear._buffers["weight"]
        return weight.dense if isinstance(weight, KernelWeight) else weight

    def __call__(self, x: Tensor) -> Tensor:
        """``[..., sum N]``: every member's output, side by side in member order."""
        weights = [self._plain(m) for m in self.linears]
        if isinstance(weights[0], QuantizedWeight):  # laid out together by quantize_model
            if self._key is None or any(a is not b for a, b in zip(self._key, weights)):
                self._key, self._joined = tuple(weights), joined_rows(weights)
            if self._joined is None:
                return torch.cat([F.linear(x, w) for w in weights], -1)
            return F.linear(x, self._joined)
        key = tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)
        if key != self._key:
            self._joined = KernelWeight.of(torch.cat([w.detach() for w in weights]))
            self._key = key
        return F.linear(x, self._joined)


class _FastDraftLayer:
    """:meth:`EagleDraftModel.project <specdec_kernels.eagle.model.EagleDraftModel.project>`,
    ``finish`` and ``logits`` for decoding, bit for bit, in fewer calls (each of the draft's
    forwards on a 2-core CPU spent about as long between its ops as in its linears): q/k/v and
    gate/up joined (:class:`_JoinedLinear`), the norms, the residual add before the second
    norm, the rotary embedding of q and k together and the SiLU gate on the package's
    decoder-layer ops (each gives the bits of the torch expression it replaces), the rotary
    angles computed once for q and k. No autograd: drafting only (the model's own methods
    train)."""

    def __init__(self, draft: EagleDraftModel):
        self.draft = draft
        layer = draft.midlayer
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _JoinedLinear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.gate_up = _JoinedLinear(mlp.gate_proj, mlp.up_proj)

    @staticmethod
    def fits(draft: EagleDraftModel) -> bool:
        """Whether the draft computes what this class reproduces: the EAGLE-3 network itself
        (a subclass with its own pieces, EAGLE-1's, keeps them), its linears without bias."""
        kind = type(draft)
        same = all(getattr(kind, name) is getattr(EagleDraftModel, name)
                   for name in ("project", "finish", "logits", "embed"))
        layer = draft.midlayer
        linears = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                   layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                   layer.mlp.down_proj]
        return same and all(m.bias is None for m in linears)

    def _norm(self, x: Tensor, norm) -> Tensor:
        return ops.rms_norm(x, norm.weight.detach(), norm.eps)

    def project(self, hidden: Tensor, tokens: Tensor, positions: Tensor):
        draft, c = self.draft, self.draft.config
        layer = draft.midlayer
        x = torch.cat([self._norm(draft.embed(tokens), layer.input_layernorm),
                       self._norm(hidden, layer.hidden_norm)], -1)
        b, n, _ = x.shape
        heads, kv_heads, d = c.num_heads, c.num_kv_heads, c.head_dim
        qkv = self.qkv(x)
        # positions may be [B, 1] for a block of siblings (all at one depth).
        cos, sin = rope_tables(positions.expand(b, n), d, c.rope_theta, x.dtype)
        # q's and k's heads are neighbouring columns of one output: one rotary call for both.
        qk = qkv[..., : (heads + kv_heads) * d].view(b, n, heads + kv_heads, d)
        qk = ops.rotary_embedding(qk, cos, sin)
        q, k = qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2)
        v = qkv[..., (heads + kv_heads) * d :].view(b, n, kv_heads, d).transpose(1, 2)
        return q, k, v, hidden

    def finish(self, residual: Tensor, attended: Tensor) -> Tensor:
        layer = self.draft.midlayer
        b, _, n, _ = attended.shape
        o = layer.self_attn.o_proj(attended.transpose(1, 2).reshape(b, n, -1))
        norm = layer.post_attention_layernorm
        out, x = ops.add_rms_norm(o, residual, norm.weight.detach(), norm.eps)
        gate_up = self.gate_up(x)
        size = self.gate_up.sizes[0]
        return out + layer.mlp.down_proj(ops.silu_mul(gate_up[..., :size], gate_up[..., size:]))

    def logits(self, output: Tensor) -> Tensor:
        return self.draft.lm_head(self._norm(output, self.draft.norm))


#: Least draft probability of a sampled row: every token stays drawable, so ``top_k`` draws
#: without replacement always exist (the same row is the ``q`` verification uses).
_MIN_Q = 1e-20


def _own_copy(draft: EagleDraftModel) -> EagleDraftModel:
    """A copy of ``draft`` without the target's embedding it may have borrowed."""
    borrowed = draft.__dict__.pop("_borrowed_embedding", None)
    try:
        return copy.deepcopy(draft)
    finally:
        if borrowed is not None:
            draft.__dict__["_borrowed_embedding"] = borrowed


def _bucket(q: float) -> int:
    for i, edge in enumerate(_BUCKETS):
        if q < edge:
            return i
    return len(_BUCKETS) - 1


class EagleDrafter(Drafter):
    """EAGLE-3 draft network + EAGLE-2 dynamic tree (see the module notes).

    Parameters
    ----------
    eagle_draft : EagleDraftModel, str, Path or None
        The draft network, a folder in the published EAGLE-3 layout
        (:func:`~specdec_kernels.eagle.model.load_eagle`), or ``None`` for the
        drafter shipped for the default model.
    branching : int
        Nodes expanded per depth, and children per expanded node.
    max_depth : int
        Deepest draft level.
    max_nodes : int
        Most drafted nodes a tree keeps (the cost model picks fewer when they do not pay).
    cost_curve : str, Path, dict or StepCost, optional
        The device's step-cost curve (default: this machine's, see
        :meth:`~specdec_kernels.decoding.runner.ModelRunner.step_cost`).
    draft_dtype : torch.dtype or str
        The draft network's weights and activations (``"float32"`` or ``"bfloat16"``), or
        ``"int8"``: float32 activations and int8 weights in groups of 32 through
        :func:`~specdec_kernels.ops.quantized_linear` (a quarter of the bytes: on a CPU the
        draft's weights then stay in the last-level cache while the target's stream by), or
        ``"auto"`` (default): ``"int8"`` where the target runs the package's CPU kernels
        (measured 4-5% faster than float32 with a float32 target and 14-20% at a GGUF file's
        precision, on both ISA paths, bench/RESULTS.md 2026-11-28), else ``"float32"``. The
        draft's choice of tokens, never the output, depends on it.
    """

    name = "eagle"

    def __init__(self, eagle_draft=None, *, branching: int = 8, max_depth: int = 6,
                 max_nodes: int = 48, cost_curve=None, draft_dtype="auto"):
        draft = eagle_draft
        if draft is None:
            draft = default_eagle_path()
        if isinstance(draft, (str, Path)):
            self._folder = Path(draft)
            draft = None
        elif isinstance(draft, EagleDraftModel):
            self._folder = None
        else:
            raise ValueError(
                f"eagle_draft must be an EagleDraftModel, a folder or None, got {type(draft)}")
        for name, value in (("branching", branching), ("max_depth", max_depth),
                            ("max_nodes", max_nodes)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.auto_dtype = isinstance(draft_dtype, str) and draft_dtype == "auto"
        self.int8 = draft_dtype == "int8"
        dtype = torch.float32 if self.int8 or self.auto_dtype else (
            getattr(torch, draft_dtype, None) if isinstance(draft_dtype, str) else draft_dtype)
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(
                f"draft_dtype must be auto, float32, bfloat16 or int8, got {draft_dtype!r}")
        self.dtype = dtype
        self._own = draft is None  # loaded from a folder at bind: ours to convert
        if draft is not None and (dtype != torch.float32 or self.int8):
            draft, self._own = _own_copy(draft), True  # the caller's network keeps its weights
        self.draft = draft
        self.top_k, self.max_depth = int(branching), int(max_depth)
        self.max_nodes = int(max_nodes)
        self.cost_curve = cost_curve
        self.budget: TreeBudget | None = None
        self.stats = AcceptanceStats(prior_weight=4.0, max_depth=self.max_depth,
                                     max_rank=self.top_k)
        # Over the drafter's life (every run it served): see report().
        self._counts = {"proposals": 0, "draft_forwards": 0, "tree_nodes": 0}
        self._draft_ms = None  # running mean of one draft forward
        self._expand_ms = None  # running mean of one depth's expansion (forward, head, bookkeeping)
        self._propose_ms = None  # running mean of a whole propose
        if draft is not None:
            self.target_features = FeatureSpec(draft.config.capture_layers, prompt_rows="all")

    # ------------------------------------------------------------------ set-up

    def bind(self, runner, tokenizer) -> None:
        if self.draft is None:
            self.draft = load_eagle(self._folder, runner.num_layers)
            self.target_features = FeatureSpec(self.draft.config.capture_layers,
                                               prompt_rows="all")
        self.draft.check_target(int(runner.config.hidden_size), runner.vocab_size,
                                runner.num_layers)
        if self.auto_dtype:
            self.int8 = runner.device.type == "cpu" and runner.cpu_kernels
            if self.int8 and not self._own:
                self.draft, self._own = _own_copy(self.draft), True
        draft = self.draft
        draft.to(device=runner.device, dtype=self.dtype).eval()
        if self.int8:
            quantize_model(draft, 8, 32)  # its own copy; linears already quantized are kept
        draft.bind_target(runner.model)
        self.budget = TreeBudget(runner.step_cost(self.cost_curve), max_nodes=self.max_nodes)
        # Weight-read share of one draft forward in a one-token target step (what a forward
        # costs where steps are memory bound, e.g. a GPU): the projection's draft cost.
        own = sum(p.numel() for p in draft.parameters() if p.dim() > 1)
        # int8 weights (buffers): their bytes as a count of the target's float32 elements.
        own += sum(b.nbytes_resident // 4 for b in draft.buffers() if isinstance(b, QuantizedWeight))
        embed = runner.model.get_input_embeddings().weight
        target = sum(p.numel() for p in runner.model.parameters())
        if runner.model.get_output_embeddings().weight is embed:
            target += embed.numel()  # tied: the LM head reads the embedding matrix again
        self._forward_fraction = own / max(target - embed.numel(), 1)
        self._price_nodes(None)
        self.device = runner.device
        self._linears = runner.linears(draft)
        # The draft's forward pieces: the same bits in fewer calls where they fit.
        self._layer = _FastDraftLayer(draft) if _FastDraftLayer.fits(draft) else draft

    def max_block_width(self) -> int:
        return self.max_nodes + 1

    def describe(self) -> dict:
        out = {"name": self.name, "branching": self.top_k, "max_depth": self.max_depth,
               "max_nodes": self.max_nodes,
               "draft_dtype": "int8" if self.int8 else str(self.dtype).removeprefix("torch.")}
        if self.draft is not None:
            c = self.draft.config
            out.update(draft_vocab=c.draft_vocab_size, capture_layers=list(c.capture_layers))
        if self.budget is not None:
            # Draft cost per step as a share of c(1): the draft forwards a step measured so far
            # (the catch-up's included), else the most a step can run.
            forwards = self._per_proposal()["draft_forwards_per_step"] or self.max_depth
            out["head_cost_fraction"] = round(forwards * self._forward_fraction, 5)
        return out

    def report(self) -> dict:
        return {"acceptance": self.stats.table(),
                "draft_forward_ms": None if self._draft_ms is None else round(self._draft_ms, 3),
                "propose_ms": None if self._propose_ms is None else round(self._propose_ms, 3),
                **self._per_proposal()}

    def _per_proposal(self) -> dict:
        """Draft forwards (the catch-up's included) and drafted nodes per request, per step."""
        n = self._counts["proposals"]
        return {f"{name}_per_step": round(self._counts[name] / n, 3) if n else None
                for name in ("draft_forwards", "tree_nodes")}

    # ------------------------------------------------------------------ the draft's cache

    def start(self, state: DecodeState) -> None:
        c = self.draft.config
        capacity = state.cache.capacity + 2 * self.max_depth * self.top_k + 2
        shape = (state.batch, c.num_kv_heads, capacity, c.head_dim)
        self.keys = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.values = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.lens = [0] * state.batch
        self._trees: list = []
        self._sampling = False
        self._generator = None

    def select_requests(self, keep: list) -> None:
        index = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)
        self.lens = [self.lens[i] for i in keep]

    def _write(self, rows: Tensor, k: Tensor, v: Tensor) -> None:
        """Write ``k``/``v`` ``[B, kv, N, D]`` at cache rows ``rows`` ``[B, N]``."""
        index = rows[:, None, :, None].expand_as(k)
        self.keys.scatter_(2, index, k)
        self.values.scatter_(2, index, v)

    def _run(self, hidden, tokens, positions, rows, mask) -> Tensor:
        """One draft forward over ``[B, N]`` rows written at cache ``rows``; ``mask``
        ``[B, N, S]`` over the cache's first ``S`` rows. Returns the pre-norm outputs."""
        t0 = time.perf_counter()
        self._counts["draft_forwards"] += 1
        layer = self._layer
        q, k, v, residual = layer.project(hidden, tokens, positions)
        self._write(rows, k, v)
        width = mask.shape[-1]
        attended = self.draft.attend(q, self.keys[:, :, :width], self.values[:, :, :width], mask)
        out = layer.finish(residual, attended)
        ms = (time.perf_counter() - t0) * 1e3
        self._draft_ms = ms if self._draft_ms is None else 0.9 * self._draft_ms + 0.1 * ms
        return out

    def _catch_up(self, state: DecodeState) -> tuple:
        """Commit the draft rows of the newly accepted target rows; returns the last row's
        output ``[B, H]`` and which requests have one (``[B]`` bool)."""
        counts = state.feature_counts.tolist()
        width = max(counts)
        batch = state.batch
        if width == 0:
            hidden = torch.zeros(batch, self.draft.config.hidden_size, device=self.device,
                                 dtype=self.dtype)
            return hidden, [False] * batch
        for b in range(batch):
            if self.lens[b] + counts[b] != state.cache.host_lens[b]:
                raise RuntimeError(
                    f"the EAGLE draft's cache ({self.lens[b]} rows + {counts[b]} new) is out of "
                    f"step with the target's ({state.cache.host_lens[b]})"
                )
        tokens = torch.zeros(batch, width, dtype=torch.int64)
        for b, ctx in enumerate(state.contexts):
            start = self.lens[b]
            tokens[b, : counts[b]] = torch.tensor(ctx[start + 1 : start + 1 + counts[b]])
        tokens = tokens.to(self.device)
        starts = torch.tensor(self.lens, device=self.device)
        cols = torch.arange(width, device=self.device)
        positions = starts[:, None] + cols
        span = max(self.lens) + width
        visible = torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None]
        features = state.features[:, :width].to(self.dtype)
        out = self._run(self.draft.fuse(features), tokens, positions, positions, visible)
        self.lens = [n + c for n, c in zip(self.lens, counts)]
        last = torch.tensor([max(c - 1, 0) for c in counts], device=self.device)
        root = out[torch.arange(batch, device=self.device), last]
        return root, [c > 0 for c in counts]

    # ------------------------------------------------------------------ proposing

    def _children(self, logits: Tensor, sampling: bool, temperature: Tensor):
        """Top-k (greedy) or ``k`` draws without replacement (sampling) of each row's draft
        distribution: ``(ids [.., k] full vocabulary, q of each [.., k], q rows [.., Vd],
        draft-vocabulary index of each [.., k])``. Drawn without replacement, siblings never
        repeat a token (with replacement, at temperature 0.7 the kept siblings were often
        copies, each a verified row with no chance once the first was rejected); sibling
        ``r``'s distribution is then the row with siblings ``0..r-1`` removed, which is what
        :meth:`_select` hands to verification."""
        if sampling:
            scaled = logits / temperature.view(-1, *([1] * (logits.dim() - 1)))
            probs = torch.softmax(scaled.float(), -1).clamp_min(_MIN_Q)  # >= k candidates
            probs = probs / probs.sum(-1, keepdim=True)
            # The exponential race: token i arrives at E_i / p_i (E_i = -log(1 - U_i) ~ Exp(1));
            # the first k arrivals, in order, are k draws each from what the earlier ones left.
            # (torch's multinomial without replacement took 0.54 ms for 3 rows of 4096 here,
            # its exponential_ 0.45 ms; uniform draws and a log 0.17 ms.)
            uniform = torch.rand(probs.shape, generator=self._generator, device=probs.device)
            draws = uniform.neg_().log1p_().div_(probs).topk(self.top_k, -1).indices  # -E/p
        else:
            probs = torch.softmax(logits.float(), -1)
            draws = probs.topk(self.top_k, -1).indices
        return self.draft.draft_ids[draws], probs.gather(-1, draws), probs, draws

    def propose(self, state: DecodeState) -> TreeProposal:
        with self._linears():  # the draft network on the target's kernels
            return self._propose(state)

    def _price_nodes(self, context: float | None) -> None:
        """A one-token step's cost, and the verification cost of one more drafted node on
        average over the largest tree, after ``context`` cached rows."""
        self._prior_step_ms = self.budget.step_cost(1, context)
        self._node_ms = max(self.budget.step_cost(1 + self.max_nodes, context)
                            - self._prior_step_ms, 0.0) / self.max_nodes

    def _propose(self, state: DecodeState) -> TreeProposal:
        t_start = time.perf_counter()
        self._price_nodes(state.context_length)
        draft, device, k = self.draft, self.device, self.top_k
        batch = state.batch
        sampling = not state.greedy
        if sampling and self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(int(state.draft_params.seed[0]) & 0x7FFFFFFF)
        temperature = _temperatures(state, batch, device)
        root_out, has_root = self._catch_up(state)
        lens = torch.tensor(self.lens, device=device)
        base = max(self.lens)  # scratch rows of the tree start here (past every prefix)
        ids, q, probs, draws = self._children(self._layer.logits(root_out), sampling, temperature)
        # Candidate nodes, per request, in creation order: token, parent candidate (-1: the
        # root), q given the parent, path score (summed log chance of acceptance, see
        # _log_rates), and the q rows they were drawn from (one row per node that ran: the
        # root's first).
        nodes = {"token": [ids], "parent": [torch.full((batch, k), -1, device=device)],
                 "q": [q], "depth": [1], "score": [self._log_rates(1, q, sampling)],
                 "qrows": [probs[:, None]], "draw": [draws]}
        frontier_hidden = root_out[:, None].expand(batch, k, -1)
        frontier_index = torch.arange(k, device=device).expand(batch, k)  # nodes at depth 1
        created = k
        run_row = torch.full((batch, k), -1, dtype=torch.int64, device=device)  # per candidate
        visible_tree = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)
        run_rows = 0
        prefix = torch.arange(base, device=device)[None, None, :] < lens[:, None, None]
        for depth in range(1, min(self.max_depth, max(max(state.remaining) - 1, 1))):
            depth_scores = torch.cat(nodes["score"], 1).gather(1, frontier_index)
            if not self._worth_expanding(depth_scores):
                break
            t_depth = time.perf_counter()
            chosen = depth_scores.topk(min(k, depth_scores.shape[1]), -1).indices
            run_nodes = frontier_index.gather(1, chosen)  # [B, r] candidates that run now
            r = run_nodes.shape[1]
            tokens = torch.cat(nodes["token"], 1).gather(1, run_nodes)
            parents = torch.cat(nodes["parent"], 1).gather(1, run_nodes)
            hidden = frontier_hidden.gather(1, chosen[..., None].expand(-1, -1, root_out.shape[-1]))
            positions = (lens - 1)[:, None] + depth
            rows = base + run_rows + torch.arange(r, device=device).expand(batch, r)
            # Visibility: the committed prefix, the node's ancestors that ran, itself.
            own = torch.zeros(batch, r, run_rows + r, dtype=torch.bool, device=device)
            if run_rows:
                parent_run = run_row.gather(1, parents.clamp(min=0))
                parent_run = torch.where(parents >= 0, parent_run, torch.full_like(parent_run, -1))
                grown = torch.nn.functional.pad(visible_tree, (0, r))
                inherited = grown.gather(
                    1, parent_run.clamp(min=0)[..., None].expand(-1, -1, run_rows + r))
                own |= inherited & (parent_run >= 0)[..., None]
            diagonal = torch.arange(r, device=device)
            own[:, diagonal, run_rows + diagonal] = True
            mask = torch.cat([prefix.expand(batch, r, base), own], -1)
            out = self._run(hidden, tokens, positions, rows, mask)
            visible_tree = torch.cat([torch.nn.functional.pad(visible_tree, (0, r)), own], 1)
            run_row.scatter_(1, run_nodes, run_rows + diagonal.expand(batch, r))
            run_rows += r
            cids, cq, cprobs, cdraws = self._children(self._layer.logits(out), sampling,
                                                      temperature)
            parent_scores = depth_scores.gather(1, chosen)
            nodes["token"].append(cids.reshape(batch, r * k))
            nodes["parent"].append(run_nodes[..., None].expand(-1, -1, k).reshape(batch, r * k))
            nodes["q"].append(cq.reshape(batch, r * k))
            nodes["depth"].append(depth + 1)
            scores = parent_scores[..., None] + self._log_rates(depth + 1, cq, sampling)
            nodes["score"].append(scores.reshape(batch, r * k))
            nodes["qrows"].append(cprobs)
            nodes["draw"].append(cdraws.reshape(batch, r * k))
            frontier_hidden = out[:, :, None].expand(-1, -1, k, -1).reshape(batch, r * k, -1)
            frontier_index = created + torch.arange(r * k, device=device).expand(batch, r * k)
            run_row = torch.nn.functional.pad(run_row, (0, r * k), value=-1)
            created += r * k
            ms = (time.perf_counter() - t_depth) * 1e3
            self._expand_ms = ms if self._expand_ms is None else 0.9 * self._expand_ms + 0.1 * ms
        proposal = self._select(state, nodes, has_root, sampling)
        self._counts["proposals"] += 1
        self._counts["tree_nodes"] += sum(len(tree) - 1 for tree in self._trees) / batch
        ms = (time.perf_counter() - t_start) * 1e3
        self._propose_ms = ms if self._propose_ms is None else 0.9 * self._propose_ms + 0.1 * ms
        return proposal

    def _log_rates(self, depth: int, q: Tensor, sampling: bool) -> Tensor:
        """Log chance that nodes at ``depth`` are accepted given their parent, shaped as ``q``
        (their draft probabilities, siblings by rank along the last dimension). Greedy: ``q``
        itself (measured close to the acceptance, bench/RESULTS.md). Sampled: the measured
        acceptance of sampled nodes of that depth and rank. A sampled token is accepted with
        ``min(1, p/q)``, so its own ``q`` says little (at temperature 0.7, valuing depths by
        it ran 2.9 draft forwards a step where 1.9 gave the same tokens per step)."""
        if not sampling:
            return q.log()
        rates = [self._rate(("eagle-sampled", depth, rank), 0.0) for rank in range(q.shape[-1])]
        return torch.tensor(rates, device=q.device).log().expand_as(q)

    def _worth_expanding(self, scores: Tensor) -> bool:
        """Whether another depth is expected to pay for itself: each of the ``top_k`` best
        paths' chance of acceptance (its expected extra tokens, :meth:`_log_rates`) valued at a
        one-token step's measured cost, less the verification cost of one more node, summed,
        against the measured time of one expansion (the draft forward, its head and the tree's
        bookkeeping)."""
        if self._expand_ms is None:
            return True
        best = scores.topk(min(self.top_k, scores.shape[1]), -1).values.exp()
        gain = (best * self._prior_step_ms - self._node_ms).clamp(min=0).sum(-1)
        return float(gain.max()) > self._expand_ms

    def _select(self, state: DecodeState, nodes: dict, has_root: list,
                sampling: bool) -> TreeProposal:
        """Keep the budget's nodes of every request's candidate tree; build the proposal."""
        batch, device = state.batch, self.device
        tokens = torch.cat(nodes["token"], 1).tolist()
        parents = torch.cat(nodes["parent"], 1).tolist()
        qs = torch.cat(nodes["q"], 1).tolist()
        counts = [t.shape[1] for t in nodes["token"]]
        depths = [d for d, n in zip(nodes["depth"], counts) for _ in range(n)]
        ranks = [j % self.top_k for n in counts for j in range(n)]
        considered = None
        if not sampling:
            # Only the best candidates by draft score can be kept (scores fall along a path,
            # so this set holds every member's ancestors): the rest skip the host loop.
            scores = torch.cat(nodes["score"], 1)
            count = min(2 * self.max_nodes, scores.shape[1])
            considered = [set(row) for row in scores.topk(count, -1).indices.tolist()]
        trees, labels = [], []
        rates = {}  # per step: a node's rate depends only on its key
        for b in range(batch):
            limit = max(state.remaining[b] - 1, 0) if has_root[b] else 0
            # Candidate j becomes tree node j + 1 (the root is node 0).
            par = [-1] + [p + 1 for p in parents[b]]
            cond, label = [1.0], [None]
            for j in range(len(tokens[b])):
                depth = depths[j]
                if depth > limit or (considered is not None and j not in considered[b]):
                    cond.append(0.0)
                    label.append(None)
                    continue
                if sampling:
                    key = ("eagle-sampled", depth, ranks[j])
                else:
                    key = (f"eagle:b{_bucket(qs[b][j])}", depth, 0)
                label.append(key)
                if key not in rates:
                    rates[key] = self._rate(key, qs[b][j])
                cond.append(rates[key])
            probs = [1.0] * len(par)
            for j in range(1, len(par)):
                probs[j] = probs[par[j]] * cond[j] if par[j] >= 0 else cond[j]
            trees.append((par, probs))
            labels.append(label)
        self.budget.overhead_ms = self._propose_ms or 0.0
        kept, _, _ = self.budget.choose(trees, state.context_length)
        width = max(len(k) for k in kept)
        out_tokens = torch.zeros(batch, width, dtype=torch.int64)
        out_parents = torch.full((batch, width), -2, dtype=torch.int64)
        self._trees = []
        qrows = None
        if sampling:
            vd = self.draft.config.draft_vocab_size
            rows_per_group = [t.reshape(batch, -1, vd) for t in nodes["qrows"]]
            # q row of candidate j: its parent's distribution (one per run node) less its
            # earlier siblings' tokens (drawn without replacement, see _children).
            group_rows = torch.cat(rows_per_group, 1)
            draws = torch.cat(nodes["draw"], 1).tolist()
            qrows = torch.zeros(batch, width, self.draft.config.vocab_size, device=device)
        depths_out = []
        for b in range(batch):
            order = kept[b]
            index = {node: i for i, node in enumerate(order)}
            tree = []
            at, groups, removed = [], [], ([], [])  # the kept nodes' q rows, built at once
            for i, node in enumerate(order):
                if node == 0:
                    out_tokens[b, 0] = int(state.contexts[b][-1])
                    out_parents[b, 0] = -1
                    tree.append((-1, None, None))
                    continue
                j = node - 1
                parent = trees[b][0][node]
                out_tokens[b, i] = tokens[b][j]
                out_parents[b, i] = index[max(parent, 0)]
                tree.append((index[max(parent, 0)], tokens[b][j], labels[b][node]))
                if sampling:
                    for drawn in draws[b][j - ranks[j] : j]:  # earlier siblings' tokens
                        removed[0].append(len(at))
                        removed[1].append(drawn)
                    at.append(i)
                    groups.append(self._group_of(j, counts))
            if at:
                qrows[b, at] = self._sibling_rows(group_rows[b, groups], removed)
            self._trees.append(tree)
            depths_out.append(max((depths[n - 1] for n in order if n > 0), default=0))
        return TreeProposal(out_tokens.to(device), out_parents.to(device), depths_out,
                            probs=qrows)

    def _sibling_rows(self, rows: Tensor, removed: tuple) -> Tensor:
        """Full-vocabulary ``q`` rows ``[n, V]`` of ``n`` kept nodes from their parents' draft
        rows ``[n, Vd]``: each less its earlier siblings' tokens (``removed``: row indices,
        draft-vocabulary ids), renormalised; rows with nothing removed stay as drawn."""
        if removed[0]:
            rows[removed] = 0.0
            renormalise = torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)
            renormalise[removed[0]] = True
            rows = torch.where(renormalise[:, None], rows / rows.sum(-1, keepdim=True), rows)
        full = rows.new_zeros(rows.shape[0], self.draft.config.vocab_size)
        full[:, self.draft.draft_ids] = rows
        return full

    def _group_of(self, j: int, counts: list) -> int:
        """Index of the distribution candidate ``j`` was drawn from (the root's is 0, then
        one per node that ran, in run order)."""
        if j < counts[0]:
            return 0
        j -= counts[0]
        group = 1
        for n in counts[1:]:
            if j < n:
                return group + j // self.top_k
            j -= n
            group += n // self.top_k
        raise IndexError(j)

    def _rate(self, key: tuple, q: float) -> float:
        """Measured acceptance of nodes like this one; the prior is the draft's own
        probability (the middle of the node's bucket), replaced by evidence as it comes."""
        prophet, depth, rank = key
        if prophet not in self.stats.priors:
            if prophet.endswith("sampled"):
                self.stats.priors[prophet] = 0.5
            else:
                b = _bucket(q)
                low = _BUCKETS[b - 1] if b else 0.0
                self.stats.priors[prophet] = (low + min(_BUCKETS[b], 1.0)) / 2
        return self.stats.rate(prophet, depth, rank)

    def accept(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Record which tried nodes were accepted (the acceptance statistics)."""
        for b, tree in enumerate(self._trees):
            n = outcome.num_accepted[b]
            emitted = state.contexts[b][len(state.contexts[b]) - n - 1 :]
            node = 0
            for token in emitted[:n] + [None]:
                children = [i for i, (p, _, _) in enumerate(tree) if p == node]
                hit = None
                for i in children:
                    _, tok, key = tree[i]
                    accepted = hit is None and tok == token
                    if key is not None:
                        self.stats.record(*key, accepted)
                    if accepted:
                        hit = i
                if hit is None:
                    break
                node = hit


def _temperatures(state: DecodeState, batch: int, device) -> Tensor:
    """``[B]`` the target's temperature of each request (1 for greedy ones: their drafts are
    verified greedily whatever ``q``)."""
    t = state.params.temperature
    if isinstance(t, Tensor):
        t = t.to(device=device, dtype=torch.float32)
    else:
        t = torch.full((batch,), float(t), device=device)
    return torch.where(t > 0, t, torch.ones_like(t))
