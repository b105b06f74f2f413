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
