"""Typed wrappers of the KV-cache ops (``csrc/kv_cache.cpp``, ``csrc/cuda/kv_cache.cu``): keep
the accepted rows of a verification step, in contiguous or paged caches, and roll paged caches
back.

Each wrapper's fake (meta) kernel is registered right after it; the executable specification
is the function of the same name in :mod:`specdec_kernels.reference`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels.ops._common import needs_host_check
from specdec_kernels.types import CacheList, as_cache_list

__all__ = ["compact_kv_cache_", "compact_paged_kv_cache_", "rollback_paged_kv_cache_"]


def _stand_in_caches(caches: list[Tensor], heads_dim: int) -> list[Tensor]:
    """One CPU cache of the caches' geometry with no heads: the CPU kernel checks every index
    against it and moves nothing."""
    if not caches or caches[0].dim() != 4:
        return caches  # let the op report the bad cache list
    shape = list(caches[0].shape)
    shape[heads_dim] = 0
    return [torch.empty(shape, dtype=caches[0].dtype)]


def _check_written_blocks_not_shared(
    block_tables: Tensor, block_size: int, cache_lens: Tensor, num_accepted: Tensor
) -> None:
    """The paged compaction's precondition, on host tensors: a physical block that receives a
    row (a destination cache_lens[b] + i) belongs to that request alone."""
    tables = block_tables.long()
    writers = {}  # physical block -> (request, logical position) of its first destination
    for b in range(tables.shape[0]):
        start, count = int(cache_lens[b]), int(num_accepted[b])
        for position in range(start, start + max(count, 0)):
            index = position // block_size
            if 0 <= index < tables.shape[1] and tables[b, index] >= 0:
                writers.setdefault(int(tables[b, index]), (b, position))
    for b in range(tables.shape[0]):
        for block in set(tables[b][tables[b] >= 0].tolist()):
            writer = writers.get(block)
            if writer is not None and writer[0] != b:
                raise ValueError(
                    f"compact_paged_kv_cache_: block {block} receives row {writer[1]} of request "
                    f"{writer[0]} but is also in block_tables[{b}]: a block shared by forked "
                    "requests must be copied for the request that writes into it first "
                    "(requests are compacted in parallel)"
                )


def compact_kv_cache_(
    caches: CacheList,
    cache_lens: Tensor,
    accept_positions: Tensor,
    num_accepted: Tensor,
    *,
    validate: bool = False,
) -> None:
    """Keep only the accepted rows of a verification step, for every layer, in place.

    For each request ``b``, the K/V rows at positions ``accept_positions[b, :num_accepted[b]]``
    move to positions ``cache_lens[b], ..., cache_lens[b] + num_accepted[b] - 1`` as if all
    rows were read before any is written (sources and destinations may overlap), then
    ``cache_lens`` advances by ``num_accepted``. All layers move in one kernel launch.

    Parameters
    ----------
    caches : Tensor or sequence of Tensor
        Per-layer K and V, each ``[B, H, S, D]`` (alike in shape, strides and dtype, last
        dimension contiguous), or one stacked ``[L, 2, B, H, S, D]`` buffer. Modified in place.
    cache_lens : Tensor
        ``[B]`` committed length of each request. Advanced in place.
    accept_positions : Tensor
        ``[B, P]`` absolute positions of the accepted rows, in order, ``-1`` padded. Each must
        lie in the speculative region ``[cache_lens[b], S)``.
    num_accepted : Tensor
        ``[B]`` number of valid columns of ``accept_positions`` per request, in ``[0, P]``.
    validate : bool
        Check the index values before anything is written. The CPU kernel always does; on CUDA
        this costs one device-to-host copy (a host sync), so it is off by default there and the
        kernel instead skips rows outside the cache (nothing outside the tensors is touched,
        but the result for a bad request is unspecified). Not allowed during graph capture.

    Raises
    ------
    ValueError
        Mismatched shapes, dtypes or devices; with ``validate`` (always on CPU) counts outside
        ``[0, P]`` or positions outside the written rows.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> k = torch.arange(8.0).view(1, 1, 8, 1)  # B = 1, H = 1, S = 8, D = 1: row i holds i
    >>> v = k.clone()
    >>> cache_lens = torch.tensor([3])  # rows 3.. hold a verified block
    >>> ops.compact_kv_cache_([k, v], cache_lens, torch.tensor([[3, 5, 6]]), torch.tensor([3]))
    >>> k.flatten().tolist(), cache_lens  # rows 3, 5, 6 kept, now at 3, 4, 5
    ([0.0, 1.0, 2.0, 3.0, 5.0, 6.0, 6.0, 7.0], tensor([6]))
    """
    cache_list = as_cache_list(caches)
    if needs_host_check(validate, cache_lens, accept_positions, num_accepted):
        torch.ops.specdec.compact_kv_cache_(
            _stand_in_caches(cache_list, 1), cache_lens.cpu().clone(), accept_positions.cpu(),
            num_accepted.cpu(),
        )
    torch.ops.specdec.compact_kv_cache_(cache_list, cache_lens, accept_positions, num_accepted)


@torch.library.register_fake("specdec::compact_kv_cache_")
def _compact_kv_cache_fake(caches, cache_lens, accept_positions, num_accepted):
    return None


def compact_paged_kv_cache_(
    caches: CacheList,
    block_tables: Tensor,
    cache_lens: Tensor,
    accept_positions: Tensor,
    num_accepted: Tensor,
    *,
    validate: bool = False,
) -> None:
    """:func:`compact_kv_cache_` for paged caches, through a block table.

    Logical position ``p`` of request ``b`` is slot ``p % block_size`` of physical block
    ``block_tables[b, p // block_size]``.

    Precondition (requests are moved in parallel): a physical block that receives a row for
    request ``b`` (holds one of its destinations ``cache_lens[b] .. cache_lens[b] +
    num_accepted[b] - 1``) must not appear in another request's block table. Forked sequences
    may share the full blocks of their committed prefix, but a shared block that is only
    partly filled must be copied for a request (copy-on-write) before it compacts into it;
    otherwise two requests could write, or one write what another reads, concurrently.
    ``validate=True`` checks this on any device.

    Parameters
    ----------
    caches : Tensor or sequence of Tensor
        Per-layer K and V, each ``[num_blocks, block_size, H, D]``, or one stacked
        ``[L, 2, num_blocks, block_size, H, D]`` buffer. Modified in place.
    block_tables : Tensor
        ``[B, max_blocks]`` physical block of each logical block, ``-1`` where unallocated.
    cache_lens : Tensor
        ``[B]`` committed length of each request. Advanced in place.
    accept_positions : Tensor
        ``[B, P]`` logical positions of the accepted rows, ``-1`` padded; each at or after
        ``cache_lens[b]`` and inside an allocated block.
    num_accepted : Tensor
        ``[B]`` valid columns of ``accept_positions`` per request.
    validate : bool
        As in :func:`compact_kv_cache_`, plus the shared-block precondition (checked on the
        host on every device: one device-to-host copy on CUDA).

    Raises
    ------
    ValueError
        As :func:`compact_kv_cache_`; with ``validate`` (always on CPU) positions whose block is
        not allocated, and with ``validate`` a written block shared with another request.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> k = torch.arange(8.0).view(4, 2, 1, 1)  # 4 blocks of 2 slots; slot s of block n: 2n + s
    >>> block_tables = torch.tensor([[2, 0, -1, -1]])  # logical rows 0-1 in block 2, 2-3 in block 0
    >>> cache_lens = torch.tensor([1])
    >>> accept_positions, num_accepted = torch.tensor([[3]]), torch.tensor([1])
    >>> ops.compact_paged_kv_cache_([k], block_tables, cache_lens, accept_positions, num_accepted)
    >>> k.flatten().tolist(), cache_lens  # row 3 (block 0, slot 1) moved to row 1 (block 2, slot 1)
    ([0.0, 1.0, 2.0, 3.0, 4.0, 1.0, 6.0, 7.0], tensor([2]))
    """
    cache_list = as_cache_list(caches)
    if validate:
        host = [t.cpu() for t in (block_tables, cache_lens, accept_positions, num_accepted)]
        if needs_host_check(validate, block_tables, cache_lens, accept_positions, num_accepted):
            torch.ops.specdec.compact_paged_kv_cache_(
                _stand_in_caches(cache_list, 2), host[0], host[1].clone(), host[2], host[3]
            )
        if cache_list and cache_list[0].dim() == 4 and block_tables.dim() == 2:
            _check_written_blocks_not_shared(host[0], cache_list[0].shape[1], host[1], host[3])
    torch.ops.specdec.compact_paged_kv_cache_(
        cache_list, block_tables, cache_lens, accept_positions, num_accepted
    )


@torch.library.register_fake("specdec::compact_paged_kv_cache_")
def _compact_paged_kv_cache_fake(caches, block_tables, cache_lens, accept_positions, num_accepted):
    return None


def rollback_paged_kv_cache_(
    block_tables: Tensor,
    cache_lens: Tensor,
    new_lens: Tensor,
    block_size: int,
    *,
    validate: bool = False,
) -> Tensor:
    """Truncate each request of a paged cache and release the blocks it no longer needs.

    Every allocated entry ``block_tables[b, j]`` with ``j >= ceil(new_lens[b] / block_size)``
    is released: set to ``-1`` in the table and reported in the returned tensor. Then
    ``cache_lens = new_lens``.

    Parameters
    ----------
    block_tables : Tensor
        ``[B, max_blocks]`` int32/int64, ``-1`` where unallocated. Modified in place.
    cache_lens : Tensor
        ``[B]`` current lengths. Set to ``new_lens`` in place.
    new_lens : Tensor
        ``[B]`` lengths to truncate to, each in ``[0, cache_lens[b]]``.
    block_size : int
        Tokens per block.
    validate : bool
        Check ``0 <= new_lens <= cache_lens`` first, as :func:`compact_kv_cache_` describes (the
        CPU kernel always does; unchecked on CUDA, a bad length only frees more or fewer blocks).

    Returns
    -------
    Tensor
        ``[B, max_blocks]`` released block ids of each request, left-aligned, ``-1`` padded.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> block_tables = torch.tensor([[2, 0, 3, -1]])  # 3 blocks of 2 hold 5 rows
    >>> cache_lens = torch.tensor([5])
    >>> new_lens = torch.tensor([2])
    >>> freed = ops.rollback_paged_kv_cache_(block_tables, cache_lens, new_lens, block_size=2)
    >>> block_tables, cache_lens, freed
    (tensor([[ 2, -1, -1, -1]]), tensor([2]), tensor([[ 0,  3, -1, -1]]))
    """
    if needs_host_check(validate, block_tables, cache_lens, new_lens):
        tables = block_tables.cpu().clone()
        torch.ops.specdec.rollback_paged_kv_cache_(
            tables, cache_lens.cpu().clone(), new_lens.cpu(), block_size, torch.empty_like(tables)
        )
    freed_blocks = torch.empty_like(block_tables)
    torch.ops.specdec.rollback_paged_kv_cache_(
        block_tables, cache_lens, new_lens, block_size, freed_blocks
    )
    return freed_blocks


@torch.library.register_fake("specdec::rollback_paged_kv_cache_")
def _rollback_paged_kv_cache_fake(block_tables, cache_lens, new_lens, block_size, freed_blocks):
    return None
