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

from typing import NamedTuple  # noqa: E402  (kept in this section to keep merges trivial)

__all__ += ["TreeMasks", "build_tree_masks", "tree_attention"]


class TreeMasks(NamedTuple):
    """Outputs of :func:`build_tree_masks` (``B`` requests, ``T`` nodes each)."""

    mask: Tensor
    """``[B, T, T]`` bool: ``mask[b, j, k]`` iff node ``k`` is an ancestor of ``j`` or ``j``."""
    packed_mask: Tensor
    """``[B, T, ceil(T / 32)]`` int32: ``mask`` bit-packed, bit ``k % 32`` of word ``k // 32``."""
    position_ids: Tensor
    """``[B, T]`` int64: ``prefix_lens[b] + depth`` (padding nodes: ``prefix_lens[b]``)."""
    depth: Tensor
    """``[B, T]`` int64: the root has depth 0, padding nodes -1."""
    retrieve_paths: Tensor
    """``[B, T, T]`` int64: row ``i`` is the root-to-leaf path of the ``i``-th leaf (leaves in
    node order), ``-1`` padded; rows ``>= num_leaves[b]`` are all ``-1``."""
    num_leaves: Tensor
    """``[B]`` int64: leaves of each tree (0 for a request without a tree)."""


def build_tree_masks(parents: Tensor, prefix_lens: Tensor) -> TreeMasks:
    """Attention masks, positions and root-to-leaf paths of a batch of draft trees.

    Parameters
    ----------
    parents : Tensor
        ``[B, T]`` int32/int64. ``parents[b, 0] = -1`` (node 0 is the root); for every other
        node ``0 <= parents[b, j] < j``, or ``-2`` for an unused node of a ragged tree
        (see :func:`specdec_kernels.tree.stack_trees`). A request whose node 0 is ``-2`` has no
        tree: every node is padding.
    prefix_lens : Tensor
        ``[B]`` of the same dtype: tokens before the root (the committed prefix length).

    Returns
    -------
    TreeMasks
        ``mask [B, T, T]`` bool, ``packed_mask [B, T, ceil(T/32)]`` int32, ``position_ids
        [B, T]``, ``depth [B, T]``, ``retrieve_paths [B, T, T]`` and ``num_leaves [B]`` (int64).
        A padding node's mask row holds only itself, so attention rows are never empty.
        Trim ``retrieve_paths`` to ``[:, :num_leaves.max(), :depth.max() + 1]`` for a compact
        Medusa-style retrieve table.

    Raises
    ------
    ValueError
        Bad shapes or dtypes, a node 0 that is not ``-1``/``-2``, a second root, a parent not
        before its child (a cycle), a padding parent, or a negative prefix length.
    """
    return TreeMasks(*torch.ops.specdec.build_tree_masks(parents, prefix_lens))


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    tree_mask: Tensor,
    scale: float | None = None,
) -> Tensor:
    """Attention of the tokens of a draft tree over a KV cache holding prefix + tree.

    Token ``j`` of request ``b`` attends to the whole prefix (cache rows ``0 .. cache_lens[b]
    - 1``) and to tree node ``k`` (cache row ``cache_lens[b] + k``) where bit ``k`` of
    ``tree_mask[b, j]`` is set: with the mask from :func:`build_tree_masks`, its ancestors and
    itself. Softmax in fp32 (online, over key tiles; on CUDA the prefix is split across blocks
    and the partial results combined, flash-decoding style). ``T = 1`` with the root-only mask
    is plain decode attention.

    Parameters
    ----------
    q : Tensor
        ``[B, T, Hq, D]`` queries of the tree tokens (float32, float16 or bfloat16; last
        dimension contiguous, other strides free).
    k_cache, v_cache : Tensor
        ``[B, Hkv, S, D]``, same dtype as ``q``, with the tree's K/V already written at rows
        ``cache_lens[b] + j``. ``Hq`` must be a multiple of ``Hkv`` (GQA/MQA: query head ``i``
        reads KV head ``i // (Hq // Hkv)``).
    cache_lens : Tensor
        ``[B]`` int32/int64 prefix length of each request; ``cache_lens[b] + T <= S``.
    tree_mask : Tensor
        ``[B, T, ceil(T / 32)]`` int32 bit-packed mask (``build_tree_masks(...).packed_mask`` or
        :func:`specdec_kernels.tree.pack_tree_mask`).
    scale : float, optional
        Softmax scale; default ``D ** -0.5``.

    Returns
    -------
    Tensor
        ``[B, T, Hq, D]`` contiguous, dtype of ``q``. A row that sees no key is zero.

    Raises
    ------
    ValueError
        Shapes, dtypes or devices that disagree, head counts not divisible, a mask whose shape
        does not match ``T``, or a cache too short for prefix + tree.

    Notes
    -----
    On CUDA the cache lengths are checked on the host (one small device-to-host copy), except
    while a CUDA graph is being captured, where the caller is trusted and out-of-range lengths
    are clamped to the cache instead.
    """
    if tree_mask.dtype == torch.bool:
        raise ValueError(
            "tree_attention takes the bit-packed int32 mask [B, T, ceil(T / 32)]: pass "
            "build_tree_masks(...).packed_mask or specdec_kernels.tree.pack_tree_mask(mask)"
        )
    if scale is None:
        scale = q.shape[-1] ** -0.5 if q.dim() == 4 and q.shape[-1] > 0 else 1.0
    return torch.ops.specdec.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, float(scale))


@torch.library.register_fake("specdec::build_tree_masks")
def _build_tree_masks_fake(parents, prefix_lens):
    batch, nodes = parents.shape
    words = (nodes + 31) // 32

    def new(*shape, dtype=torch.int64):
        return parents.new_empty(shape, dtype=dtype)

    return (
        new(batch, nodes, nodes, dtype=torch.bool),
        new(batch, nodes, words, dtype=torch.int32),
        new(batch, nodes),
        new(batch, nodes),
        new(batch, nodes, nodes),
        new(batch),
    )


@torch.library.register_fake("specdec::tree_attention")
def _tree_attention_fake(q, k_cache, v_cache, cache_lens, tree_mask, scale):
    return q.new_empty(q.shape)
