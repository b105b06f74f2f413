"""Plain data types that the ops, their reference and the decoding layer share.

Nothing here calls an op: this module sits below :mod:`specdec_kernels.ops` (the typed
wrappers), :mod:`specdec_kernels.reference` (the executable specification) and
:mod:`specdec_kernels.decoding`, so each of them can name these types without importing the
others. Per-request sampling parameters, shared the same way, are
:class:`specdec_kernels.sampling.SamplingParams`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence, Union

from torch import Tensor

__all__ = ["CacheList", "LookaheadMasks", "TreeMasks", "as_cache_list"]

#: The K/V caches of the KV ops: per-layer K and V tensors, or one stacked ``[L, 2, ...]`` buffer.
CacheList = Union[Tensor, Sequence[Tensor]]


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

    Examples
    --------
    >>> import torch
    >>> len(as_cache_list(torch.zeros(3, 2, 1, 4, 8, 16)))  # 3 layers, K and V each
    6
    """
    if isinstance(caches, Tensor):
        if caches.dim() != 6:
            raise ValueError(
                "a stacked cache must have shape [L, 2, ...4 cache dims], "
                f"got {tuple(caches.shape)}"
            )
        return list(caches.flatten(0, 1).unbind(0))
    return list(caches)


class TreeMasks(NamedTuple):
    """Outputs of :func:`specdec_kernels.ops.build_tree_masks` (``B`` requests, ``T`` nodes
    each)."""

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


class LookaheadMasks(NamedTuple):
    """Outputs of :func:`specdec_kernels.ops.build_lookahead_masks` (``B`` requests, ``R``
    window rows after ``T`` tree nodes)."""

    mask: Tensor
    """``[B, R, T + R]`` bool: ``mask[b, r, k]`` iff window row ``r`` attends to block column
    ``k`` (tree node ``k < T``, window row ``k - T`` otherwise)."""
    packed_mask: Tensor
    """``[B, R, ceil((T + R) / 32)]`` int32: ``mask`` bit-packed like :class:`TreeMasks`."""
    positions: Tensor
    """``[B, R]`` int64: each row's position after the root's (``-1`` on padding rows)."""
