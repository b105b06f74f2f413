"""The 4-D attention masks Hugging Face models accept, for blocks of new tokens after a cached
prefix: a draft tree (each node sees the prefix and its ancestors), or any block with an
explicit mask and explicit positions (a lookahead window). Boolean masks (what sdpa takes) and
their additive float form (what eager attention adds), with sliding windows and with padding
anywhere in the prefix.

Used by the 4-D mask path of :mod:`specdec_kernels.models.hf_tree_attention`; the tree masks
themselves come from :func:`specdec_kernels.ops.build_tree_masks`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "additive_mask",
    "prefix_valid_from_lens",
    "tree_attention_bias_4d",
    "tree_attention_mask_4d",
]


def prefix_valid_from_lens(prefix_lens: Tensor, past_length: int) -> Tensor:
    """``[B, past_length]`` bool: True on the first ``prefix_lens[b]`` columns (right padding).

    Parameters
    ----------
    prefix_lens : Tensor
        ``[B]`` valid prefix length of each request, each ``<= past_length``.
    past_length : int
        Columns of the padded cache before the tree.
    """
    columns = torch.arange(past_length, device=prefix_lens.device)
    return columns[None, :] < prefix_lens[:, None]


def tree_attention_mask_4d(
    tree_mask: Tensor,
    prefix_valid: Tensor,
    *,
    sliding_window: int | None = None,
    depth: Tensor | None = None,
) -> Tensor:
    """Boolean 4-D mask over ``[prefix + tree]`` in the form Hugging Face models accept.

    Query ``j`` (tree node ``j``) may attend to every valid prefix column and to the tree
    columns of its ancestors and itself. The layout matches a padded HF cache: the prefix
    occupies the first ``P`` key columns (padding anywhere, e.g. left padding from a batched
    prefill, marked False in ``prefix_valid``) and the tree's own K/V the last ``T``. Pass the
    result as ``attention_mask`` together with ``position_ids`` from
    :func:`specdec_kernels.ops.build_tree_masks` (prefix length = valid columns per request).

    Parameters
    ----------
    tree_mask : Tensor
        ``[B, T, T]`` bool ancestor-or-self mask (``build_tree_masks(...).mask``).
    prefix_valid : Tensor
        ``[B, P]`` bool (or 0/1 integer, e.g. HF's 2-D ``attention_mask`` of the prefix):
        which prefix columns hold real tokens. ``P`` may be 0.
    sliding_window : int, optional
        For sliding-window layers: key ``k`` is visible to query ``q`` only if their positions
        differ by less than the window (HF's convention). Positions count valid columns, so the
        mask is right for a truncated sliding cache too when ``prefix_valid`` describes that
        layer's cache.
    depth : Tensor, optional
        ``[B, T]`` position of each node after the root, for the sliding window; by default
        the node's ancestor count minus one (right for trees; give it for blocks whose rows
        are not a tree).

    Returns
    -------
    Tensor
        ``[B, 1, T, P + T]`` bool, True where attention is allowed. A padding node (parent
        ``-2``) sees itself and the prefix, so no row is empty.
    """
    if tree_mask.dim() != 3 or tree_mask.shape[1] != tree_mask.shape[2]:
        raise ValueError(f"tree_mask must have shape [B, T, T], got {tuple(tree_mask.shape)}")
    if prefix_valid.dim() != 2 or prefix_valid.shape[0] != tree_mask.shape[0]:
        raise ValueError(
            f"prefix_valid must have shape [B, P] with B = {tree_mask.shape[0]}, "
            f"got {tuple(prefix_valid.shape)}"
        )
    tree_mask = tree_mask.to(torch.bool)
    prefix_valid = prefix_valid.to(device=tree_mask.device, dtype=torch.bool)
    num_tree = tree_mask.shape[1]
    prefix = prefix_valid[:, None, :].expand(-1, num_tree, -1)
    tree = tree_mask
    if sliding_window is not None:
        if sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        if depth is None:
            depth = tree_mask.sum(-1) - 1  # ancestors-or-self minus one
        depth = depth.to(device=tree_mask.device, dtype=torch.int64)
        valid_count = prefix_valid.sum(-1, keepdim=True)  # [B, 1]
        key_pos = prefix_valid.cumsum(-1) - 1  # [B, P] position of each valid column
        query_pos = valid_count + depth  # [B, T]
        prefix = prefix & (query_pos[:, :, None] - key_pos[:, None, :] < sliding_window)
        tree = tree & (depth[:, :, None] - depth[:, None, :] < sliding_window)
    return torch.cat([prefix, tree], dim=-1)[:, None]


def tree_attention_bias_4d(
    tree_mask: Tensor,
    prefix_valid: Tensor,
    dtype: torch.dtype,
    *,
    sliding_window: int | None = None,
) -> Tensor:
    """Additive float form of :func:`tree_attention_mask_4d`: 0 where allowed, the dtype's
    most negative finite value elsewhere (HF's convention for eager attention).

    Parameters
    ----------
    tree_mask, prefix_valid, sliding_window
        As for :func:`tree_attention_mask_4d`.
    dtype : torch.dtype
        Floating dtype of the bias (the model's dtype).

    Returns
    -------
    Tensor
        ``[B, 1, T, P + T]`` of ``dtype``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    allowed = tree_attention_mask_4d(tree_mask, prefix_valid, sliding_window=sliding_window)
    return additive_mask(allowed, dtype)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """HF's additive form of a boolean mask: 0 where ``mask`` allows, the dtype's most
    negative finite value elsewhere (what eager attention adds; sdpa accepts it too)."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, torch.finfo(dtype).min)
