"""Typed Python wrappers of ``torch.ops.specdec.*`` and their fake (meta) kernels.

Each wrapper documents shapes and semantics; the executable specification of the same op is
the function of the same name in :mod:`specdec_kernels.reference`. Index tensors are int32 or
int64 (one dtype per call) and live on the device of the data they index.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import Tensor

CacheList = Union[Tensor, Sequence[Tensor]]

__all__ = [
    "as_cache_list",
    "compact_kv_cache_",
    "compact_paged_kv_cache_",
    "rollback_paged_kv_cache_",
]


# ----------------------------------------------------------------------------- KV cache


def as_cache_list(caches: CacheList) -> list[Tensor]:
    """Views of every per-layer K/V tensor of a cache, in one list.

    Parameters
    ----------
    caches : Tensor or sequence of Tensor
        Either a sequence of 4-D tensors (per layer K and V) or one stacked 6-D buffer
        ``[L, 2, ...]`` whose trailing four dimensions are one K or V tensor.

    Returns
    -------
    list of Tensor
        ``2L`` views for a stacked buffer, else the tensors as given.
    """
    if isinstance(caches, Tensor):
        if caches.dim() != 6:
            raise ValueError(
                "a stacked cache must have shape [L, 2, ...4 cache dims], "
                f"got {tuple(caches.shape)}"
            )
        return list(caches.flatten(0, 1).unbind(0))
    return list(caches)


def compact_kv_cache_(
    caches: CacheList, cache_lens: Tensor, accept_positions: Tensor, num_accepted: Tensor
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

    Raises
    ------
    RuntimeError
        Mismatched shapes, dtypes or devices, or positions outside the written rows.
    """
    torch.ops.specdec.compact_kv_cache_(
        as_cache_list(caches), cache_lens, accept_positions, num_accepted
    )


def compact_paged_kv_cache_(
    caches: CacheList,
    block_tables: Tensor,
    cache_lens: Tensor,
    accept_positions: Tensor,
    num_accepted: Tensor,
) -> None:
    """:func:`compact_kv_cache_` for paged caches, through a block table.

    Logical position ``p`` of request ``b`` is slot ``p % block_size`` of physical block
    ``block_tables[b, p // block_size]``. Requests must not share the blocks being written.

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
    """
    torch.ops.specdec.compact_paged_kv_cache_(
        as_cache_list(caches), block_tables, cache_lens, accept_positions, num_accepted
    )


def rollback_paged_kv_cache_(
    block_tables: Tensor, cache_lens: Tensor, new_lens: Tensor, block_size: int
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

    Returns
    -------
    Tensor
        ``[B, max_blocks]`` released block ids of each request, left-aligned, ``-1`` padded.
    """
    freed_blocks = torch.empty_like(block_tables)
    torch.ops.specdec.rollback_paged_kv_cache_(
        block_tables, cache_lens, new_lens, block_size, freed_blocks
    )
    return freed_blocks


@torch.library.register_fake("specdec::compact_kv_cache_")
def _compact_kv_cache_fake(caches, cache_lens, accept_positions, num_accepted):
    return None


@torch.library.register_fake("specdec::compact_paged_kv_cache_")
def _compact_paged_kv_cache_fake(caches, block_tables, cache_lens, accept_positions, num_accepted):
    return None


@torch.library.register_fake("specdec::rollback_paged_kv_cache_")
def _rollback_paged_kv_cache_fake(block_tables, cache_lens, new_lens, block_size, freed_blocks):
    return None


# ----------------------------------------------------------------------------- verification


# ----------------------------------------------------------------------------- tree attention
