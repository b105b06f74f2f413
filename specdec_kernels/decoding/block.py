"""The block a decoding step runs through the target, placed in the engine's cache: its
positions and attention inputs.

Every block the engine runs (prefill, drafting, chain or tree verification) is a tree to the
model: a chain is the tree whose node ``j`` has parent ``j - 1``. Its positions and masks come
from :func:`specdec_kernels.ops.build_tree_masks` through the HF helpers of
:mod:`~specdec_kernels.models.hf_tree_attention`; the only thing added here is the placement
of the block in the engine's cache, where request ``b``'s block starts at its own row
``starts[b]`` rather than after a common padded prefix. A block may also end with extra rows
that are not part of the tree (:class:`~specdec_kernels.decoding.drafter.ExtraRows`: own
positions, own packed masks), combined with the tree by :func:`block_masks`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.models.hf_masks import additive_mask, prefix_valid_from_lens
from specdec_kernels.models.hf_tree_attention import (
    METADATA_KWARG,
    TreeAttentionMetadata,
    block_mask_forward_kwargs,
    tree_kernel_forward_kwargs,
    tree_mask_forward_kwargs,
)
from specdec_kernels.tree import unpack_tree_mask

__all__ = ["block_forward_kwargs", "block_masks", "chain_parents"]

_CHAIN_CACHE: dict = {}


def chain_parents(batch: int, width: int, device) -> Tensor:
    """``[B, T]`` parents of a chain block: ``-1, 0, 1, ..., T - 2`` for every request."""
    key = (batch, width, str(device))
    parents = _CHAIN_CACHE.get(key)
    if parents is None:
        row = torch.arange(-1, width - 1, dtype=torch.int64)
        parents = row.expand(batch, width).contiguous().to(device)
        if len(_CHAIN_CACHE) > 64:
            _CHAIN_CACHE.clear()
        _CHAIN_CACHE[key] = parents
    return parents


def _place_rows(mask: Tensor, starts: list, width: int) -> Tensor:
    """Move the block's columns of a ``[B, 1, T, P + T]`` mask (prefix ``P = max(starts)``,
    then the block) to each request's own rows ``starts[b] .. starts[b] + T - 1``; columns
    between a request's block and ``P + T`` are hidden (another request's rows)."""
    batch = mask.shape[0]
    prefix = max(starts)
    kv_len = prefix + width
    cols = torch.arange(kv_len, device=mask.device)[None, :]
    begin = torch.tensor(starts, dtype=torch.int64).to(mask.device, non_blocking=True)[:, None]
    source = torch.where(cols < begin, cols, prefix + cols - begin)
    source = torch.where(cols < begin + width, source, torch.full_like(source, kv_len))
    padded = torch.cat([mask, torch.zeros_like(mask[..., :1])], -1)  # column kv_len: hidden
    index = source[:, None, None, :].expand(batch, 1, mask.shape[2], kv_len)
    return padded.gather(-1, index)


def block_masks(parents: Tensor, extra) -> tuple[Tensor, Tensor, Tensor]:
    """Masks and positions of a block made of a tree and extra rows that are not part of it.

    Parameters
    ----------
    parents : Tensor
        ``[B, T]`` int64 tree (node 0 the root, ``-2`` padding).
    extra : ExtraRows
        ``R`` rows after the tree (see :class:`~specdec_kernels.decoding.drafter.ExtraRows`).

    Returns
    -------
    mask : Tensor
        ``[B, T + R, T + R]`` bool: tree rows see their ancestors (never an extra row), extra
        rows what their mask says.
    packed_mask : Tensor
        ``[B, T + R, ceil((T + R) / 32)]`` int32, the same bit-packed.
    depth : Tensor
        ``[B, T + R]`` int64 position of each row after the root's (0 on padding).
    """
    nodes, rows = parents.shape[1], extra.num_rows
    words = extra.mask.shape[-1]
    if tuple(extra.mask.shape) != (parents.shape[0], rows, -(-(nodes + rows) // 32)):
        raise ValueError(
            f"extra rows' mask must have shape [B, R, ceil((T + R) / 32)] = "
            f"[{parents.shape[0]}, {rows}, {-(-(nodes + rows) // 32)}] for a block of T = "
            f"{nodes} tree nodes, got {tuple(extra.mask.shape)}"
        )
    tree = ops.build_tree_masks(parents, torch.zeros_like(parents[:, 0]))
    packed = torch.cat(
        [torch.nn.functional.pad(tree.packed_mask, (0, words - tree.packed_mask.shape[-1])),
         extra.mask.to(torch.int32)],
        1,
    )
    mask = torch.cat(
        [torch.nn.functional.pad(tree.mask, (0, rows)), unpack_tree_mask(extra.mask, nodes + rows)],
        1,
    )
    depth = torch.cat([tree.depth, extra.positions.to(torch.int64)], 1).clamp(min=0)
    return mask, packed, depth


def block_forward_kwargs(
    config,
    parents: Tensor,
    prefix_lens: Tensor,
    starts: list,
    dtype: torch.dtype,
    kernel: bool,
    extra=None,
) -> dict:
    """``position_ids`` and attention inputs of a block placed after each request's prefix.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's text config (layer types, sliding window).
    parents : Tensor
        ``[B, T]`` int64 block tree (node 0 the root, ``-2`` padding).
    prefix_lens : Tensor
        ``[B]`` int64 committed rows before each block (``starts`` on the device).
    starts : list of int
        The same on the host.
    dtype : torch.dtype
        The model's dtype (for the additive masks).
    kernel : bool
        The model attends with the registered tree-attention kernel: pass tree metadata
        instead of dense masks.
    extra : ExtraRows, optional
        Rows that follow the tree in the block (its width is then ``T + R``), with their own
        positions and masks (:func:`block_masks`).

    Returns
    -------
    dict
        Forward kwargs: ``position_ids`` ``[B, T]`` and either ``attention_mask`` (a
        ``[B, 1, T, max(starts) + T]`` additive mask, or a dict of them per layer type) or the
        kernel's metadata.
    """
    width = parents.shape[1]
    if extra is not None:
        block_mask, packed, depth = block_masks(parents, extra)
        width = block_mask.shape[1]
    if kernel:
        if extra is None:
            kwargs = tree_kernel_forward_kwargs(parents, prefix_lens, cache_lens=prefix_lens)
        else:
            kwargs = {
                "position_ids": prefix_lens[:, None] + depth,
                METADATA_KWARG: TreeAttentionMetadata(packed, prefix_lens, depth),
            }
        # A 4D mask (ignored by the kernel) keeps HF from building masks of its own.
        kv_len = max(starts) + width
        kwargs["attention_mask"] = torch.ones(
            1, 1, 1, 1, dtype=torch.bool, device=parents.device
        ).expand(parents.shape[0], 1, width, kv_len)
        return kwargs
    prefix_valid = prefix_valid_from_lens(prefix_lens, max(starts))
    if extra is None:
        kwargs = tree_mask_forward_kwargs(config, parents, prefix_valid)
    else:
        kwargs = block_mask_forward_kwargs(config, block_mask, depth, prefix_valid)
    masks = kwargs["attention_mask"]
    ragged = min(starts) != max(starts)

    def convert(mask):
        return additive_mask(_place_rows(mask, starts, width) if ragged else mask, dtype)

    if isinstance(masks, dict):  # one mask per layer type; kinds may share one tensor
        done = {}
        for kind, mask in masks.items():
            if id(mask) not in done:
                done[id(mask)] = convert(mask)
            masks[kind] = done[id(mask)]
    else:
        kwargs["attention_mask"] = convert(masks)
    return kwargs
