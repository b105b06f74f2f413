"""Tree forwards of unmodified Hugging Face causal LMs, through public extension points only.

A draft tree is verified in one forward of the target model. Two ways, both without touching
any transformers class:

1. **4-D mask path** (any attention implementation): pass ``position_ids`` (prefix length +
   depth) and a 4-D ``attention_mask`` over ``[prefix + tree]`` that lets each node see the
   prefix and its ancestors. :func:`tree_mask_forward_kwargs` builds both (a dict of masks per
   layer type for models with sliding-window layers).
2. **Kernel path**: :func:`register_tree_attention` registers
   :func:`tree_attention_forward` in transformers' ``AttentionInterface`` (and sdpa's mask
   builder in ``AttentionMaskInterface``) under :data:`ATTENTION_NAME`; select it with
   ``attn_implementation=ATTENTION_NAME`` (or ``model.set_attn_implementation``) and pass the
   tree metadata built by :func:`tree_kernel_forward_kwargs` as forward kwargs. Each attention
   layer then runs :func:`specdec_kernels.ops.tree_attention` on the cache HF hands it. Forwards
   without tree metadata (prefill, plain decoding) fall back to HF's own sdpa attention.

Example
-------
>>> register_tree_attention()
>>> model.set_attn_implementation(ATTENTION_NAME)
>>> out = model(tree_tokens, **cache_kwargs(model, cache), **tree_kernel_forward_kwargs(parents, lens))
>>> out.logits[b, j]   # the target's prediction after tree node j
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.models.hf_masks import tree_attention_mask_4d
from specdec_kernels.tree import unpack_tree_mask

__all__ = [
    "ATTENTION_NAME",
    "METADATA_KWARG",
    "TreeAttentionMetadata",
    "block_mask_forward_kwargs",
    "register_tree_attention",
    "tree_attention_forward",
    "tree_kernel_forward_kwargs",
    "tree_mask_forward_kwargs",
]

#: Name of the attention implementation registered by :func:`register_tree_attention`.
ATTENTION_NAME = "specdec_tree"
#: Forward kwarg that carries :class:`TreeAttentionMetadata` down to the attention layers.
METADATA_KWARG = "specdec_tree"


@dataclass
class TreeAttentionMetadata:
    """What the attention layers need to know about the tree being verified.

    Attributes
    ----------
    packed_mask : Tensor
        ``[B, T, ceil(T / 32)]`` int32 bit-packed ancestor-or-self mask
        (``build_tree_masks(...).packed_mask``).
    cache_lens : Tensor or None
        ``[B]`` where each request's tree starts in the K/V the model's cache returns (its
        prefix length). None means the tree is the last ``T`` rows of every request, which is
        how HF's own caches lay it out; every row before it is then attended, so requests must
        be unpadded (e.g. batch 1, or equal lengths). A per-request cache that writes request
        ``b``'s tree at ``cache_lens[b]`` handles ragged batches.
    depth : Tensor or None
        ``[B, T]`` position of each row after the root's, for sliding-window layers. None
        means each row's ancestor count minus one (right for trees); blocks whose rows are
        not a tree (lookahead windows) give it explicitly.
    """

    packed_mask: Tensor
    cache_lens: Tensor | None = None
    depth: Tensor | None = None


def register_tree_attention(name: str = ATTENTION_NAME) -> str:
    """Register :func:`tree_attention_forward` with transformers under ``name``.

    Also registers sdpa's mask builder for ``name``, so forwards without tree metadata get the
    usual causal/padding masks and behave exactly like ``attn_implementation="sdpa"``.
    Idempotent.

    Returns
    -------
    str
        ``name``, for ``model.set_attn_implementation(name)`` or
        ``from_pretrained(..., attn_implementation=name)``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, tree_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def tree_kernel_forward_kwargs(
    parents: Tensor, prefix_lens: Tensor, *, cache_lens: Tensor | None = None
) -> dict:
    """Forward kwargs for a tree forward through the registered kernel.

    Parameters
    ----------
    parents : Tensor
        ``[B, T]`` tree parents (node 0 the root, ``-2`` padding), int32/int64.
    prefix_lens : Tensor
        ``[B]`` tokens before the root, same dtype and device as ``parents``: the position of
        the root.
    cache_lens : Tensor, optional
        See :class:`TreeAttentionMetadata`.

    Returns
    -------
    dict
        ``position_ids`` ``[B, T]`` and the metadata under :data:`METADATA_KWARG`; pass with
        ``input_ids`` = the tree's tokens ``[B, T]`` and the prefix cache (``cache``, ``past_key_values`` before transformers 5.24).
    """
    masks = ops.build_tree_masks(parents, prefix_lens)
    return {
        "position_ids": masks.position_ids,
        METADATA_KWARG: TreeAttentionMetadata(masks.packed_mask, cache_lens),
    }


def tree_mask_forward_kwargs(
    config, parents: Tensor, prefix_valid: Tensor, *, sliding_prefix_valid: Tensor | None = None
) -> dict:
    """Forward kwargs for a tree forward through HF's 4-D mask path.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's (text) config: its ``layer_types`` and ``sliding_window`` decide whether a
        mask per layer type is needed.
    parents : Tensor
        ``[B, T]`` tree parents, int32/int64.
    prefix_valid : Tensor
        ``[B, P]`` bool/0-1: the real (non-padding) columns of the cached prefix, e.g. the
        prefill's 2-D ``attention_mask``. The tree's K/V is appended after these ``P`` columns.
    sliding_prefix_valid : Tensor, optional
        The same for the sliding-window layers' cache when it keeps fewer columns (HF's
        ``DynamicCache`` keeps the last ``sliding_window - 1``: pass
        ``prefix_valid[:, -(sliding_window - 1):]`` once the prefix is longer). Defaults to
        ``prefix_valid``.

    Returns
    -------
    dict
        ``position_ids`` ``[B, T]`` (valid prefix tokens + depth) and ``attention_mask``: a
        ``[B, 1, T, P + T]`` bool mask, or a dict of them keyed by layer type.
    """
    prefix_valid = prefix_valid.to(device=parents.device, dtype=torch.bool)
    masks = ops.build_tree_masks(parents, prefix_valid.sum(-1).to(parents.dtype))
    return block_mask_forward_kwargs(
        config, masks.mask, masks.depth.clamp(min=0), prefix_valid,
        sliding_prefix_valid=sliding_prefix_valid,
    )


def block_mask_forward_kwargs(
    config,
    block_mask: Tensor,
    depth: Tensor,
    prefix_valid: Tensor,
    *,
    sliding_prefix_valid: Tensor | None = None,
) -> dict:
    """Forward kwargs for any block through HF's 4-D mask path: an explicit mask and explicit
    positions per row (trees, or blocks that are not trees, such as lookahead windows).

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's (text) config.
    block_mask : Tensor
        ``[B, T, T]`` bool: row ``j`` attends to block row ``k``. Every row should see itself.
    depth : Tensor
        ``[B, T]`` int64 position of each row after the first block row's (``>= 0``).
    prefix_valid, sliding_prefix_valid : Tensor
        As for :func:`tree_mask_forward_kwargs`.

    Returns
    -------
    dict
        ``position_ids`` ``[B, T]`` (valid prefix tokens + depth) and ``attention_mask``, as
        :func:`tree_mask_forward_kwargs`.
    """
    prefix_valid = prefix_valid.to(device=block_mask.device, dtype=torch.bool)
    mask = tree_attention_mask_4d(block_mask, prefix_valid)
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in layer_types and window:
        sliding = prefix_valid if sliding_prefix_valid is None else sliding_prefix_valid
        mask = {kind: mask for kind in set(layer_types)}
        mask["sliding_attention"] = tree_attention_mask_4d(
            block_mask, sliding.to(device=block_mask.device, dtype=torch.bool),
            sliding_window=window, depth=depth,
        )
    position_ids = prefix_valid.sum(-1, keepdim=True) + depth
    return {"position_ids": position_ids, "attention_mask": mask}


def _sdpa_forward(module, query, key, value, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if key.dtype != query.dtype:  # a narrow cache (KVCache's dtype) widens for sdpa
        key, value = key.to(query.dtype), value.to(query.dtype)
    return sdpa_attention_forward(module, query, key, value, *args, **kwargs)


def _windowed_tree_mask(meta: TreeAttentionMetadata, cache_lens: Tensor, key_length: int,
                        window: int) -> Tensor:
    """Dense ``[B, 1, T, key_length]`` bool mask of the tree under a sliding window. Positions
    are relative to the cache rows: prefix row ``i`` of request ``b`` is ``cache_lens[b] - i``
    positions behind the root, tree node ``k`` at its depth."""
    nodes = meta.packed_mask.shape[1]
    tree = unpack_tree_mask(meta.packed_mask, nodes)  # [B, T, T]
    depth = tree.sum(-1) - 1 if meta.depth is None else meta.depth.to(tree.device)  # [B, T]
    cols = torch.arange(key_length, device=tree.device)
    start = cache_lens.to(torch.int64)[:, None, None]  # [B, 1, 1]
    query_pos = start + depth[:, :, None]  # [B, T, 1]
    in_prefix = cols < start
    prefix_ok = in_prefix & (query_pos - cols < window)
    node = (cols - start).clamp(0, max(nodes - 1, 0)).expand(-1, nodes, -1)  # [B, T, S]
    in_tree = (cols >= start) & (cols < start + nodes)
    key_depth = depth.gather(1, node[:, 0])[:, None, :]  # [B, 1, S] depth of each tree column
    tree_ok = in_tree & tree.gather(2, node) & (depth[:, :, None] - key_depth < window)
    return (prefix_ok | tree_ok)[:, None]


def tree_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """Attention function for transformers' ``AttentionInterface`` (see module docs).

    Parameters
    ----------
    module : torch.nn.Module
        The calling attention layer.
    query : Tensor
        ``[B, Hq, T, D]``.
    key, value : Tensor
        ``[B, Hkv, S, D]`` as returned by the cache: the prefix, then the tree.
    attention_mask : Tensor or None
        The mask HF prepared; ignored on the tree path (the tree metadata replaces it).
    scaling : float, optional
        Softmax scale (default ``D ** -0.5``).
    dropout : float
        Must be 0 on the tree path (inference only).
    sliding_window : int, optional
        Set by sliding-window layers. When the window could hide part of the cache from some
        node, the layer computes the exact windowed mask and uses sdpa instead of the kernel.
    **kwargs
        Forward kwargs; :data:`METADATA_KWARG` holds the :class:`TreeAttentionMetadata`.

    Returns
    -------
    tuple
        ``([B, T, Hq, D] output, None)``, as HF attention functions return.

    Raises
    ------
    ValueError
        Logit soft-capping, dropout, or metadata that does not match the inputs.
    """
    meta = kwargs.pop(METADATA_KWARG, None)
    if meta is None:
        return _sdpa_forward(module, query, key, value, attention_mask, dropout=dropout,
                             scaling=scaling, sliding_window=sliding_window, **kwargs)
    if kwargs.get("softcap") is not None:
        raise ValueError("tree attention does not support attention logit soft-capping")
    if dropout:
        raise ValueError("tree attention is for inference: dropout must be 0")
    batch, _, nodes, _ = query.shape
    key_length = key.shape[2]
    if meta.packed_mask.shape[:2] != (batch, nodes):
        raise ValueError(
            f"tree metadata is for [B, T] = {tuple(meta.packed_mask.shape[:2])} but the layer "
            f"sees {batch} requests of {nodes} tokens"
        )
    cache_lens = meta.cache_lens
    if cache_lens is None:
        cache_lens = torch.full((batch,), key_length - nodes, dtype=torch.int64, device=key.device)
    if sliding_window is not None and key_length > sliding_window:
        mask = _windowed_tree_mask(meta, cache_lens, key_length, sliding_window)
        return _sdpa_forward(module, query, key, value, mask, dropout=0.0, scaling=scaling, **kwargs)
    out = ops.tree_attention(query.transpose(1, 2), key, value, cache_lens, meta.packed_mask, scaling)
    return out, None
