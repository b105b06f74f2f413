"""Pure-PyTorch reference of every specdec op: the executable specification.

Written for clarity, not speed: loops over requests, no fused arithmetic. The compiled
kernels must agree with these functions (bit for bit for data movement and decisions, within
floating-point tolerance for arithmetic). Arguments are assumed valid; argument checking is
the compiled ops' job.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels.ops import CacheList, as_cache_list

# ----------------------------------------------------------------------------- tree attention


def build_tree_masks(parents: Tensor, prefix_lens: Tensor):
    """Reference of :func:`specdec_kernels.ops.build_tree_masks` (one node at a time)."""
    from specdec_kernels.ops import TreeMasks
    from specdec_kernels.tree import pack_tree_mask

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


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    tree_mask: Tensor,
    scale: float,
) -> Tensor:
    """Reference of :func:`specdec_kernels.ops.tree_attention`: SDPA with the dense mask over
    ``[prefix + tree]``, one request at a time, in the inputs' dtype (upcast them for an
    accurate reference)."""
    from specdec_kernels.tree import unpack_tree_mask

    batch, nodes, q_heads, _ = q.shape
    group = q_heads // k_cache.shape[1]
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    for b in range(batch):
        n = int(cache_lens[b])
        keys = k_cache[b, :, : n + nodes].repeat_interleave(group, dim=0)  # [Hq, n + T, D]
        values = v_cache[b, :, : n + nodes].repeat_interleave(group, dim=0)
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
