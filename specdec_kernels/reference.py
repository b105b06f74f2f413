"""Pure-PyTorch reference of every specdec op: the executable specification.

Written for clarity, not speed: loops over requests, no fused arithmetic. The compiled
kernels must agree with these functions (bit for bit for data movement and decisions, within
floating-point tolerance for arithmetic). Arguments are assumed valid; argument checking is
the compiled ops' job.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from specdec_kernels.tree import pack_tree_mask, unpack_tree_mask
from specdec_kernels.types import CacheList, LookaheadMasks, TreeMasks, as_cache_list

# ----------------------------------------------------------------------------- tree attention


def build_tree_masks(parents: Tensor, prefix_lens: Tensor):
    """Reference of :func:`specdec_kernels.ops.build_tree_masks` (one node at a time)."""
    batch, nodes = parents.shape
    device = parents.device
    mask = torch.zeros(batch, nodes, nodes, dtype=torch.bool, device=device)
    depth = torch.full((batch, nodes), -1, dtype=torch.int64, device=device)
    paths = torch.full((batch, nodes, nodes), -1, dtype=torch.int64, device=device)
    num_leaves = torch.zeros(batch, dtype=torch.int64, device=device)
    for b in range(batch):
        par = [int(p) for p in parents[b]]
        for j, p in enumerate(par):
            if p >= 0:
                mask[b, j] = mask[b, p]
                depth[b, j] = depth[b, p] + 1
            elif p == -1:
                depth[b, j] = 0
            mask[b, j, j] = True
        has_child = {p for p in par if p >= 0}
        leaves = [j for j, p in enumerate(par) if p != -2 and j not in has_child]
        for i, leaf in enumerate(leaves):
            path = mask[b, leaf].nonzero().flatten()  # ancestors in index order = root to leaf
            paths[b, i, : path.numel()] = path
        num_leaves[b] = len(leaves)
    position_ids = prefix_lens.to(torch.int64)[:, None] + depth.clamp(min=0)
    return TreeMasks(mask, pack_tree_mask(mask), position_ids, depth, paths, num_leaves)


def build_lookahead_masks(window: Tensor, levels: Tensor, tree_nodes: int, num_rows: int):
    """Reference of :func:`specdec_kernels.ops.build_lookahead_masks` (one cell at a time)."""
    batch = window.shape[0]
    columns = tree_nodes + num_rows
    device = window.device
    mask = torch.zeros(batch, num_rows, columns, dtype=torch.bool, device=device)
    positions = torch.full((batch, num_rows), -1, dtype=torch.int64, device=device)
    for b in range(batch):
        width, depth = int(window[b]), int(levels[b])

        def column(level: int, i: int) -> int:  # block column of cell (level, i)
            return 0 if level == i == 0 else tree_nodes + level * width + i - 1

        for level in range(depth):
            for i in range(width):
                if level == i == 0:
                    continue
                r = column(level, i) - tree_nodes
                seen = [column(0, j) for j in range(i + 1)]
                seen += [column(m, i) for m in range(1, level + 1)]
                mask[b, r, seen] = True
                positions[b, r] = level + i
        used = width * depth - 1 if width and depth else 0
        for r in range(used, num_rows):
            mask[b, r, tree_nodes + r] = True
    return LookaheadMasks(mask, pack_tree_mask(mask), positions)


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    tree_mask: Tensor,
    scale: float,
) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.tree_attention`: SDPA with the dense mask over
    ``[prefix + tree]``, one request at a time, in ``q``'s dtype (upcast the inputs for an
    accurate reference; a narrower cache is widened to ``q``'s dtype, exactly)."""
    batch, nodes, q_heads, _ = q.shape
    group = q_heads // k_cache.shape[1]
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    for b in range(batch):
        n = int(cache_lens[b])
        keys = k_cache[b, :, : n + nodes].to(q.dtype).repeat_interleave(group, dim=0)  # [Hq, n + T, D]
        values = v_cache[b, :, : n + nodes].to(q.dtype).repeat_interleave(group, dim=0)
        tree = unpack_tree_mask(tree_mask[b], nodes)  # [T, T]
        visible = torch.cat([tree.new_ones(nodes, n), tree], dim=1)  # [T, n + T]
        rows = torch.nn.functional.scaled_dot_product_attention(
            q[b].transpose(0, 1), keys, values, attn_mask=visible, scale=scale
        )  # [Hq, T, D]
        seen = visible.any(dim=1)[None, :, None]
        out[b] = torch.where(seen, rows, torch.zeros_like(rows)).transpose(0, 1)
    return out


# ----------------------------------------------------------------------------- KV cache


def compact_kv_cache_(
    caches: CacheList, cache_lens: Tensor, accept_positions: Tensor, num_accepted: Tensor
) -> None:
    """Reference of :func:`specdec_kernels.ops.compact_kv_cache_` (per-layer index_select + copy)."""
    for b in range(cache_lens.shape[0]):
        n = int(num_accepted[b])
        start = int(cache_lens[b])
        src = accept_positions[b, :n].long()
        dst = torch.arange(start, start + n, device=src.device)
        for cache in as_cache_list(caches):
            rows = cache[b].index_select(1, src)  # a copy: overlapping dst cannot clobber it
            cache[b].index_copy_(1, dst, rows)
    cache_lens += num_accepted


def _paged_slots(block_tables: Tensor, b: int, positions: Tensor, block_size: int):
    blocks = block_tables[b].long()[positions // block_size]
    return blocks, positions % block_size


def compact_paged_kv_cache_(
    caches: CacheList,
    block_tables: Tensor,
    cache_lens: Tensor,
    accept_positions: Tensor,
    num_accepted: Tensor,
) -> None:
    """Reference of :func:`specdec_kernels.ops.compact_paged_kv_cache_`."""
    cache_list = as_cache_list(caches)
    block_size = cache_list[0].shape[1]
    for b in range(cache_lens.shape[0]):
        n = int(num_accepted[b])
        start = int(cache_lens[b])
        src = accept_positions[b, :n].long()
        dst = torch.arange(start, start + n, device=src.device)
        src_blocks, src_slots = _paged_slots(block_tables, b, src, block_size)
        dst_blocks, dst_slots = _paged_slots(block_tables, b, dst, block_size)
        for cache in cache_list:
            rows = cache[src_blocks, src_slots].clone()
            cache[dst_blocks, dst_slots] = rows
    cache_lens += num_accepted


def rollback_paged_kv_cache_(
    block_tables: Tensor, cache_lens: Tensor, new_lens: Tensor, block_size: int
) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.rollback_paged_kv_cache_`."""
    freed_blocks = torch.full_like(block_tables, -1)
    for b in range(block_tables.shape[0]):
        keep = -(-int(new_lens[b]) // block_size)
        tail = block_tables[b, keep:]
        released = tail[tail >= 0]
        freed_blocks[b, : released.numel()] = released
        tail.fill_(-1)
    cache_lens.copy_(new_lens)
    return freed_blocks


# ----------------------------------------------------------------------------- verification
#
# The executable specification of the sampling and verification ops (see the rules in
# specdec_kernels/ops/sampling.py). Scalar arithmetic is float32 (numpy.float32), vector
# arithmetic float32 torch ops on CPU, long sums accumulate in double (torch.cumsum on CPU
# does), so the compiled kernels agree with this code bit for bit on every weight and on every
# decision except when a sum lands within a float32 rounding of a threshold.

_M32 = 0xFFFFFFFF
STREAM_VERIFY = 0
STREAM_SAMPLE = 1
_F32 = np.float32


def philox4x32_10(counter: tuple, key: tuple) -> tuple:
    """Philox4x32 with 10 rounds (Random123) on four 32-bit counter words and two key words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _M32, p1 & _M32, ((p0 >> 32) ^ c3 ^ k1) & _M32, p0 & _M32
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return c0, c1, c2, c3


def uniforms(seed: int, offset: int, position: int, stream: int) -> tuple:
    """The (accept, sample) uniforms of a request at a position: words 0 and 1 of
    Philox(counter = (offset lo, offset hi, position, stream), key = (seed lo, seed hi)), each
    mapped to ``(word >> 8) * 2**-24``."""
    seed &= 0xFFFFFFFFFFFFFFFF
    offset &= 0xFFFFFFFFFFFFFFFF
    words = philox4x32_10(
        (offset & _M32, offset >> 32, position & _M32, stream), (seed & _M32, seed >> 32)
    )
    return _F32((words[0] >> 8) * 2.0**-24), _F32((words[1] >> 8) * 2.0**-24)


def _c(value: float) -> Tensor:
    return torch.tensor(value, dtype=torch.float32)


def specdec_exp(x: Tensor) -> Tensor:
    """The ops' float32 exp (a Cephes-style polynomial; 0 below -87), operation for operation."""
    xc = x.clamp(-87.0, 88.0)
    magic = _c(12582912.0)
    n = (xc * _c(1.44269504088896341) + magic) - magic
    r = (xc - n * _c(0.693359375)) - n * _c(-2.12194440e-4)
    p = _c(1.9875691500e-4).expand_as(r)
    for coefficient in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + _c(coefficient)
    y = ((p * r) * r + r) + _c(1.0)
    scale = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(x < -87.0, torch.zeros_like(y), y * scale)


def _first_above(cumulative: Tensor, weights: Tensor, target) -> int:
    """Inverse-CDF pick: the smallest index whose cumulative weight exceeds target, else the
    last index with positive weight (else 0)."""
    above = (cumulative > torch.tensor(target, dtype=torch.float32)).nonzero()
    if above.numel():
        return int(above[0, 0])
    positive = (weights > 0).nonzero()
    return int(positive[-1, 0]) if positive.numel() else 0


def _total(weights: Tensor):
    """float32 of the double sum of weights, in index order (as the kernels accumulate)."""
    return _F32(torch.cumsum(weights, 0)[-1].item())


class ProcessedRow:
    """One row of logits after temperature, top-k, top-p and min-p.

    Attributes: ``greedy``, ``argmax``; for sampling rows ``weights`` (kept w, float32
    ``[V]``), ``total`` (their sum), ``probs`` (``weights / total``) and, with entropy,
    ``weighted_log_sum`` (the sum of w * (l - M) / T over kept tokens).
    """

    def __init__(self, logits: Tensor, temperature, top_k: int, top_p, min_p, with_entropy=False):
        l = logits.detach().to("cpu", torch.float32)
        vocab = l.numel()
        self.argmax = int(torch.argmax(l))  # the first maximal index
        self.greedy = _F32(temperature) == 0
        if self.greedy:
            self.probs = torch.zeros(vocab)
            self.probs[self.argmax] = 1.0
            return
        inv_t = _F32(1.0) / _F32(temperature)
        scaled = (l - l[self.argmax]) * _c(inv_t)
        w = specdec_exp(scaled)
        kept = torch.ones(vocab, dtype=torch.bool)
        top_k_mass = _total(w)
        if 0 < top_k < vocab:
            kth = torch.topk(l, top_k).values[-1]  # the top_k-th largest logit
            kept &= l >= kth
            top_k_mass = _F32(w[kept].double().sum().item())
        if _F32(top_p) < 1:
            candidates = kept.nonzero().flatten()
            order = candidates[torch.argsort(l[candidates], descending=True, stable=True)]
            cumulative = torch.cumsum(w[order], 0)
            target = _F32(top_p) * top_k_mass
            reached = (cumulative >= torch.tensor(target)).nonzero()
            last = int(reached[0, 0]) if reached.numel() else order.numel() - 1
            kept &= l >= l[order[last]]
        if _F32(min_p) > 0:
            kept &= w >= torch.tensor(_F32(min_p))
        self.weights = torch.where(kept, w, torch.zeros_like(w))
        self.total = _total(self.weights)
        self.probs = self.weights / torch.tensor(self.total)
        if with_entropy:
            products = self.weights * scaled
            self.weighted_log_sum = _F32(products[self.weights > 0].double().sum().item())

    def prob(self, x: int):
        return _F32(self.probs[x].item())

    def draw(self, u) -> int:
        """A draw from the processed distribution with uniform u (the argmax if greedy)."""
        if self.greedy:
            return self.argmax
        target = _F32(u) * self.total
        return _first_above(torch.cumsum(self.weights, 0), self.weights, target)

    def typical_threshold(self, posterior_threshold: float, posterior_alpha: float):
        """min(eps, alpha * exp(-H)) with exp(-H) = exp(A / Zk) / Zk."""
        mean = torch.tensor(self.weighted_log_sum / self.total)
        inv_perplexity = _F32(specdec_exp(mean).item()) / self.total
        adaptive = _F32(posterior_alpha) * inv_perplexity
        return min(adaptive, _F32(posterior_threshold))


def _row_params(params, offset: Tensor, b: int) -> dict:
    return dict(
        temperature=_F32(params.temperature[b].item()),
        top_k=int(params.top_k[b]),
        top_p=_F32(params.top_p[b].item()),
        min_p=_F32(params.min_p[b].item()),
        seed=int(params.seed[b]),
        offset=int(offset[b]),
    )


def _process(logits: Tensor, p: dict, with_entropy=False) -> ProcessedRow:
    return ProcessedRow(logits, p["temperature"], p["top_k"], p["top_p"], p["min_p"], with_entropy)


def sample_with_probs(logits: Tensor, params, offset: Tensor = None):
    """Reference of :func:`specdec_kernels.ops.sample_with_probs`."""
    rows, vocab = logits.shape
    offset = torch.zeros(rows, dtype=torch.int64) if offset is None else offset
    tokens = torch.empty(rows, dtype=torch.int64)
    probs = torch.empty(rows, vocab, dtype=torch.float32)
    for n in range(rows):
        p = _row_params(params, offset, n)
        row = _process(logits[n], p)
        tokens[n] = row.draw(uniforms(p["seed"], p["offset"], 0, STREAM_SAMPLE)[1])
        probs[n] = row.probs
    return tokens.to(logits.device), probs.to(logits.device)


def sample(logits: Tensor, params, offset: Tensor = None) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.sample`."""
    return sample_with_probs(logits, params, offset)[0]


class _Request:
    """One request as a tree: parents (-1 root, -2 padding), tokens, target rows and draft
    distributions per node."""

    def __init__(self, parents, tokens, logits_row, draft_row):
        self.parents = parents
        self.tokens = tokens
        self.logits_row = logits_row  # node -> logits [V]
        self.draft_row = draft_row  # node -> q [V] float32 CPU, or None when one-hot

    def children(self, j: int) -> list:
        return [c for c in range(len(self.parents)) if c > j and self.parents[c] == j]


def _residual(v: Tensor, q: Tensor, normaliser) -> Tensor:
    d = v - q
    return torch.where(d > 0, d / torch.tensor(normaliser), torch.zeros_like(d))


def _decide_sampling_node(req: _Request, row: ProcessedRow, p: dict, node: int):
    """Recursive rejection sampling at one node: (accepted child or None, next token)."""
    vocab = row.probs.numel()
    v = row.probs.clone()
    residual_active = False
    for c in req.children(node):
        x = req.tokens[c]
        if req.draft_row is None:
            q = torch.zeros(vocab)
            q[x] = 1.0
        else:
            q = req.draft_row(c)
        qx = _F32(q[x].item())
        vx = _F32(v[x].item())
        u = uniforms(p["seed"], p["offset"], c, STREAM_VERIFY)[0]
        if qx > 0 and u * qx < vx:
            return c, None
        if req.draft_row is None:
            normaliser = _F32(1.0) - vx
        else:
            d = v - q
            normaliser = _total(torch.where(d > 0, d, torch.zeros_like(d)))
        residual_active = True
        if normaliser > 0:
            v = _residual(v, q, normaliser)
        else:  # an all-zero residual: start again from p
            v = row.probs.clone()
            residual_active = False
    u = uniforms(p["seed"], p["offset"], node, STREAM_VERIFY)[1]
    if residual_active:
        total = _total(v)
        if total > 0:
            return None, _first_above(torch.cumsum(v, 0), v, _F32(u) * total)
    return None, row.draw(u)


def _verify_rejection(req: _Request, p: dict):
    node, path = 0, []
    while True:
        row = _process(req.logits_row(node), p)
        child, token = _decide_sampling_node(req, row, p, node)
        if child is None:
            return path, token
        path.append(child)
        node = child


def _verify_longest_path(req: _Request, p: dict, typical):
    """Greedy (typical is None) or typical acceptance: the longest passing path."""
    greedy = p["temperature"] == 0
    num_nodes = len(req.parents)
    depth = [-1] * num_nodes
    next_token = [None] * num_nodes
    depth[0] = 0
    for j in range(num_nodes):
        if depth[j] < 0:
            continue
        row = _process(req.logits_row(j), p, with_entropy=not greedy)
        threshold = None if greedy else row.typical_threshold(*typical)
        any_passed = False
        for c in req.children(j):
            x = req.tokens[c]
            passed = x == row.argmax if greedy else row.prob(x) > threshold
            if passed:
                depth[c] = depth[j] + 1
                any_passed = True
        if not any_passed:
            next_token[j] = row.draw(uniforms(p["seed"], p["offset"], j, STREAM_VERIFY)[1])
    last = max(range(num_nodes), key=lambda j: (depth[j], -j))
    path = []
    node = last
    while node != 0:
        path.append(node)
        node = req.parents[node]
    return path[::-1], next_token[last]


def _chain_request(draft_tokens, num_draft, target_logits, draft_probs, b) -> _Request:
    k = draft_tokens.shape[1]
    n = int(num_draft[b])
    parents = [-1] + [i for i in range(n)] + [-2] * (k - n)
    tokens = [0] + [int(t) for t in draft_tokens[b]]
    draft_row = None
    if draft_probs is not None:
        draft_row = lambda c: draft_probs[b, c - 1].detach().to("cpu", torch.float32)  # noqa: E731
    return _Request(parents, tokens, lambda j: target_logits[b, j], draft_row)


def _tree_request(tree_tokens, parents, target_logits, draft_probs, b) -> _Request:
    draft_row = None
    if draft_probs is not None:
        draft_row = lambda c: draft_probs[b, c].detach().to("cpu", torch.float32)  # noqa: E731
    return _Request(
        [int(x) for x in parents[b]],
        [int(x) for x in tree_tokens[b]],
        lambda j: target_logits[b, j],
        draft_row,
    )


def _run(requests, params, offset, width, typical, device):
    batch = len(requests)
    nodes = torch.full((batch, width), -1, dtype=torch.int64)
    tokens = torch.full((batch, width), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int64)
    for b, req in enumerate(requests):
        p = _row_params(params, offset, b)
        if typical is None and p["temperature"] != 0:
            path, token = _verify_rejection(req, p)
        else:
            path, token = _verify_longest_path(req, p, typical)
        n = len(path)
        nodes[b, :n] = torch.tensor(path, dtype=torch.int64)
        tokens[b, :n] = torch.tensor([req.tokens[c] for c in path], dtype=torch.int64)
        tokens[b, n] = token
        num_accepted[b] = n
    return nodes.to(device), tokens.to(device), num_accepted.to(device)


def _offset_or_zeros(offset, batch):
    return torch.zeros(batch, dtype=torch.int64) if offset is None else offset.cpu()


def verify_chain(draft_tokens, num_draft, target_logits, draft_probs, params, offset=None):
    """Reference of :func:`specdec_kernels.ops.verify_chain` (the chain as a path tree)."""
    batch, k = draft_tokens.shape
    num_draft = torch.full((batch,), k) if num_draft is None else num_draft.cpu()
    requests = [
        _chain_request(draft_tokens.cpu(), num_draft, target_logits, draft_probs, b)
        for b in range(batch)
    ]
    _, tokens, num_accepted = _run(
        requests, params, _offset_or_zeros(offset, batch), k + 1, None, target_logits.device
    )
    return tokens, num_accepted


def verify_tree(tree_tokens, parents, target_logits, draft_probs, params, offset=None):
    """Reference of :func:`specdec_kernels.ops.verify_tree`."""
    batch, width = tree_tokens.shape
    requests = [
        _tree_request(tree_tokens.cpu(), parents.cpu(), target_logits, draft_probs, b)
        for b in range(batch)
    ]
    return _run(requests, params, _offset_or_zeros(offset, batch), width, None, target_logits.device)


def typical_verify_chain(
    draft_tokens, num_draft, target_logits, params, offset=None, posterior_threshold=0.09,
    posterior_alpha=0.3,
):
    """Reference of :func:`specdec_kernels.ops.typical_verify_chain`."""
    batch, k = draft_tokens.shape
    num_draft = torch.full((batch,), k) if num_draft is None else num_draft.cpu()
    requests = [
        _chain_request(draft_tokens.cpu(), num_draft, target_logits, None, b) for b in range(batch)
    ]
    _, tokens, num_accepted = _run(
        requests, params, _offset_or_zeros(offset, batch), k + 1,
        (posterior_threshold, posterior_alpha), target_logits.device,
    )
    return tokens, num_accepted


def typical_verify_tree(
    tree_tokens, parents, target_logits, params, offset=None, posterior_threshold=0.09,
    posterior_alpha=0.3,
):
    """Reference of :func:`specdec_kernels.ops.typical_verify_tree`."""
    batch, width = tree_tokens.shape
    requests = [
        _tree_request(tree_tokens.cpu(), parents.cpu(), target_logits, None, b)
        for b in range(batch)
    ]
    return _run(
        requests, params, _offset_or_zeros(offset, batch), width,
        (posterior_threshold, posterior_alpha), target_logits.device,
    )


# ----------------------------------------------------------------------------- small-batch linear


def small_batch_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.small_batch_linear`: the product in float64,
    rounded once to ``x``'s dtype (the kernel accumulates in float32, so compare with a
    tolerance; its batch invariance is tested separately)."""
    out = x.double() @ weight.double().T
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)


# ----------------------------------------------------------------------------- quantized linear

#: Values per activation block of :func:`quantize_activations` (one int8 scale each).
ACTIVATION_BLOCK = 32


def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row int8 quantization of ``x [M, K]`` as :func:`specdec_kernels.ops.quantized_linear`
    does it: in blocks of 32 values (the last may be shorter), ``scale = amax / 127`` and
    ``q = round_half_even(x * (127 / amax))``, all in float32 (0 where ``amax == 0``).

    Returns ``q [M, K]`` int8 and ``scales [M, ceil(K / 32)]`` float32.
    """
    x = x.float()
    rows, k = x.shape
    blocks = -(-k // ACTIVATION_BLOCK)
    padded = torch.nn.functional.pad(x, (0, blocks * ACTIVATION_BLOCK - k))
    amax = padded.view(rows, blocks, ACTIVATION_BLOCK).abs().amax(-1)
    scales = amax / 127.0
    # A true division: ``127.0 / amax`` would be ``reciprocal(amax) * 127`` in torch, which
    # differs in the last bit for some amax and moves exact ties (x = 23.5, amax = 47).
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))
    scaled = padded.view(rows, blocks, ACTIVATION_BLOCK) * inverse[..., None]
    q = torch.round(scaled).clamp(-127, 127).to(torch.int8).view(rows, -1)[:, :k]
    return q, scales


def unpack_int4(packed: Tensor) -> Tensor:
    """``[N, K / 2]`` uint8 packed int4 (per 32-value block, byte j = value j | value j + 16
    << 4) to ``[N, K]`` uint8 values 0..15."""
    n, half = packed.shape
    blocks = packed.view(n, half // 16, 16)
    return torch.cat([blocks & 0x0F, blocks >> 4], dim=-1).reshape(n, half * 2)


def expand_kquant_scales(scales: Tensor, negate: bool = False) -> Tensor:
    """K-quant panel scales as the file holds them (int8 ``[N / 16, K / 256, 8 E + 32]``: per
    super-block of 8 blocks, block ``j``'s ``E`` sub-scales at bytes ``E j ..``, then the 16
    rows' float16 super-scales ``d``) to the float32 panel scales ``[N / 16, K / 32, E]`` they
    encode: ``d[r] * sub`` for entry ``16 h + r`` (``-(d * sub)`` with ``negate``: mins).
    Exact (11 by 8 significant bits)."""
    panels, supers, width = scales.shape
    entries = (width - 32) // 8
    sub = scales[..., : 8 * entries].reshape(panels, supers, 8, entries).float()
    d = scales[..., 8 * entries :].contiguous().view(torch.float16).float()  # [P, SB, 16]
    d = d.repeat(1, 1, entries // 16)  # entry 16 h + r reads row r's d
    out = d[:, :, None, :] * sub
    return (-out if negate else out).reshape(panels, supers * 8, entries)


def unpack_panels(qweight: Tensor, scales: Tensor, mins: Tensor | None = None):
    """The panel layout of :func:`specdec_kernels.ops.quantized_linear` back to the row layout:
    ``qweight [N / 16, K / 32, 64 V]`` (``V`` = 4 vectors of int4 pairs, uint8, or 8 of int8;
    byte ``64 j + 4 r + i`` of panel ``p``, block ``b`` is byte ``4 j + i`` of row
    ``16 p + r``'s block ``b``) to ``[N, K / 2]`` uint8 or ``[N, K]`` int8; scales and mins
    ``[N / 16, K / 32, 16]`` to ``[N, K / 32]`` (int8 in groups of 16: scales
    ``[N / 16, K / 32, 32]``, entry ``16 h + r`` half ``h`` of row ``r``'s block, to
    ``[N, K / 16]``; int8 K-quant scales are expanded first, :func:`expand_kquant_scales`).
    A pure permutation of bytes and values.

    Returns ``(qweight, scales, mins)`` in the row layout.
    """
    if scales.dtype == torch.int8:
        scales = expand_kquant_scales(scales)
        mins = None if mins is None else expand_kquant_scales(mins, negate=True)
    panels, blocks, block_bytes = qweight.shape
    vectors = block_bytes // 64
    rows = qweight.view(panels, blocks, vectors, 16, 4).permute(0, 3, 1, 2, 4)
    rows = rows.reshape(panels * 16, blocks * vectors * 4)

    def per_row(t):
        if t is None:
            return None
        if t.shape[2] == 32:  # two halves per block
            return t.view(panels, blocks, 2, 16).permute(0, 3, 1, 2).reshape(panels * 16, 2 * blocks)
        return t.permute(0, 2, 1).reshape(panels * 16, blocks)

    return rows, per_row(scales), per_row(mins)


def dequantize_weight(qweight: Tensor, scales: Tensor, mins: Tensor | None = None) -> Tensor:
    """The float32 ``[N, K]`` weight of :func:`specdec_kernels.ops.quantized_linear`'s operands:
    ``scales[n, g] * q + mins[n, g]`` with ``q`` the int8 values or the unpacked int4 ones (the
    panel layout first put back in rows, :func:`unpack_panels`)."""
    if qweight.dim() == 3:
        qweight, scales, mins = unpack_panels(qweight, scales, mins)
    q = unpack_int4(qweight) if qweight.dtype == torch.uint8 else qweight
    n, k = q.shape
    groups = scales.shape[1]
    w = q.float().view(n, groups, k // groups) * scales.float()[..., None]
    if mins is not None:
        w = w + mins.float()[..., None]
    return w.view(n, k)


def quantized_linear(
    x: Tensor, qweight: Tensor, scales: Tensor, mins: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.quantized_linear`: the quantized activations
    (:func:`quantize_activations`) times the dequantized weight (:func:`dequantize_weight`) in
    float64, plus the bias, rounded once to ``x``'s dtype (the kernel sums in int32, then
    float32: compare with a tolerance; batch invariance is tested separately)."""
    rows = x.reshape(-1, x.shape[-1])
    q, x_scales = quantize_activations(rows)
    k = rows.shape[1]
    x_deq = q.double() * x_scales.double().repeat_interleave(ACTIVATION_BLOCK, dim=1)[:, :k]
    w = dequantize_weight(qweight, scales, mins).double()
    out = x_deq @ w.T
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype).view(*x.shape[:-1], w.shape[0])


# ----------------------------------------------------------------------------- decoder-layer glue


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.rms_norm`: the Llama-family RMSNorm expression
    (statistics in float32, the normalised row rounded to ``x``'s dtype, then the weight)."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)).to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Reference of :func:`specdec_kernels.ops.add_rms_norm`: ``(x + residual, rms_norm(...))``."""
    total = x + residual
    return total, rms_norm(total, weight, eps)


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.rotary_embedding`: ``x * cos + rotate_half(x) *
    sin`` with ``cos``, ``sin`` ``[B, T, D]`` broadcast over the heads of ``x [B, T, H, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.silu_mul`: ``silu(gate) * up``."""
    return torch.nn.functional.silu(gate) * up


def decoder_stack_(
    hidden: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor, write_start: int,
    write_index: Tensor | None, kv_len: int, cache_lens: Tensor, tree_mask: Tensor,
    norms: list, linears: list, num_heads: int, num_kv_heads: int, scale: float, eps: float,
    capture=(),
) -> tuple[Tensor, list]:
    """Reference of :func:`specdec_kernels.ops.decoder_stack_`: the layer loop over this
    module's references of the inner ops (the linears in float64, so compare with a tolerance;
    the op's bits are those of the direct forward's own loop, tested there)."""
    batch, width, _ = hidden.shape
    head_dim = kv_cache.shape[-1]
    per_layer = 28

    def linear(x, parts):
        weight, scales, mins, bias = parts
        if scales is None:
            return small_batch_linear(x, weight, bias)
        return quantized_linear(x, weight, scales, mins, bias)

    def heads(y):
        return y.reshape(batch, width, -1, head_dim)

    captured = [None] * len(capture)
    x = rms_norm(hidden, norms[0], eps)
    for layer in range(len(linears) // per_layer):
        base = layer * per_layer
        slots = [linears[base + 4 * i : base + 4 * i + 4] for i in range(7)]
        if slots[1][0] is None:  # q, k, v joined
            sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
            q, k, v = (heads(y) for y in linear(x, slots[0]).split(sizes, -1))
        else:
            q, k, v = (heads(linear(x, slots[i])) for i in range(3))
        q, k = rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)
        for part, states in ((0, k), (1, v)):
            cache = kv_cache[layer, part]  # [B, Hkv, S, D]
            for b in range(batch):
                rows = (torch.arange(width) + write_start if write_index is None
                        else write_index[b].cpu())
                cache[b][:, rows.to(cache.device)] = states[b].transpose(0, 1)
        keys, values = kv_cache[layer, 0, :, :, :kv_len], kv_cache[layer, 1, :, :, :kv_len]
        out = tree_attention(q, keys, values, cache_lens, tree_mask, scale)
        hidden, x = add_rms_norm(linear(out.reshape(batch, width, -1), slots[3]), hidden,
                                 norms[1 + 2 * layer], eps)
        if slots[5][0] is None:  # gate and up joined
            gate, up = linear(x, slots[4]).chunk(2, -1)
        else:
            gate, up = linear(x, slots[4]), linear(x, slots[5])
        hidden, x = add_rms_norm(linear(silu_mul(gate, up), slots[6]), hidden,
                                 norms[2 + 2 * layer], eps)
        captured = [hidden if point == layer else c for point, c in zip(capture, captured)]
    return x, captured
