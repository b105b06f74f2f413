"""The engine's doorway to the op families: sampling and verification
(:mod:`specdec_kernels.ops`, :mod:`specdec_kernels.sampling`), tree building and tree masks
(:mod:`specdec_kernels.tree`, :mod:`specdec_kernels.models.hf_tree_attention`).

Every block the engine runs (prefill, drafting, chain or tree verification) is a tree to the
model: a chain is the tree whose node ``j`` has parent ``j - 1``. Its positions and masks come
from :func:`specdec_kernels.ops.build_tree_masks` through the HF helpers of
:mod:`~specdec_kernels.models.hf_tree_attention`; the only thing added here is the placement
of the block in the engine's cache, where request ``b``'s block starts at its own row
``starts[b]`` rather than after a common padded prefix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.models.hf_tree_attention import (
    ATTENTION_NAME,
    tree_kernel_forward_kwargs,
    tree_mask_forward_kwargs,
)
from specdec_kernels.sampling import SamplingParams
from specdec_kernels.tree import prefix_valid_from_lens, stack_trees, tree_from_sequences

__all__ = [
    "ATTENTION_NAME",
    "SamplingParams",
    "all_greedy",
    "block_forward_kwargs",
    "chain_parents",
    "sample",
    "sample_with_probs",
    "select_params",
    "stack_trees",
    "tree_from_sequences",
    "verify_chain",
    "verify_tree",
]

sample = ops.sample
sample_with_probs = ops.sample_with_probs
verify_chain = ops.verify_chain
verify_tree = ops.verify_tree


def select_params(params: SamplingParams, index: Tensor) -> SamplingParams:
    """The parameters of the requests at ``index`` (a ``[B']`` int64 tensor)."""
    return params.select(index)


def all_greedy(params: SamplingParams) -> bool:
    """Whether every request decodes greedily (reads the device: call once per run)."""
    return bool((params.temperature <= 0).all())


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


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """HF's additive form of a boolean mask (what eager attention adds; sdpa accepts it)."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, torch.finfo(dtype).min)


def block_forward_kwargs(
    config, parents: Tensor, prefix_lens: Tensor, starts: list, dtype: torch.dtype, kernel: bool
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

    Returns
    -------
    dict
        Forward kwargs: ``position_ids`` ``[B, T]`` and either ``attention_mask`` (a
        ``[B, 1, T, max(starts) + T]`` additive mask, or a dict of them per layer type) or the
        kernel's metadata.
    """
    width = parents.shape[1]
    if kernel:
        kwargs = tree_kernel_forward_kwargs(parents, prefix_lens, cache_lens=prefix_lens)
        # A 4D mask (ignored by the kernel) keeps HF from building masks of its own.
        kv_len = max(starts) + width
        kwargs["attention_mask"] = torch.ones(
            1, 1, 1, 1, dtype=torch.bool, device=parents.device
        ).expand(parents.shape[0], 1, width, kv_len)
        return kwargs
    prefix_valid = prefix_valid_from_lens(prefix_lens, max(starts))
    kwargs = tree_mask_forward_kwargs(config, parents, prefix_valid)
    masks = kwargs["attention_mask"]
    ragged = min(starts) != max(starts)

    def convert(mask):
        return _additive(_place_rows(mask, starts, width) if ragged else mask, dtype)

    if isinstance(masks, dict):  # one mask per layer type; kinds may share one tensor
        done = {}
        for kind, mask in masks.items():
            if id(mask) not in done:
                done[id(mask)] = convert(mask)
            masks[kind] = done[id(mask)]
    else:
        kwargs["attention_mask"] = convert(masks)
    return kwargs
