"""Typed wrappers of the tree ops (``csrc/tree.cpp``, ``csrc/cuda/tree.cu``): masks, positions
and root-to-leaf paths of draft trees, the masks of lookahead windows, and the attention of a
tree's tokens over a KV cache.

Each wrapper's fake (meta) kernel is registered right after it; the executable specification
is the function of the same name in :mod:`specdec_kernels.reference`. Host-side trees (building,
checking, stacking, packing masks) are :mod:`specdec_kernels.tree`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels.ops._common import needs_host_check
from specdec_kernels.types import LookaheadMasks, TreeMasks

__all__ = ["build_lookahead_masks", "build_tree_masks", "tree_attention"]


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

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> parents = torch.tensor([[-1, 0, 0, 1]])  # the root, its two children, a child of node 1
    >>> masks = ops.build_tree_masks(parents, prefix_lens=torch.tensor([5]))
    >>> masks.mask[0].int()  # each node sees its ancestors and itself
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 0, 1, 0],
            [1, 1, 0, 1]], dtype=torch.int32)
    >>> masks.position_ids  # prefix length + depth
    tensor([[5, 6, 6, 7]])
    >>> masks.retrieve_paths[0, : int(masks.num_leaves[0]), :3]  # leaves 2 and 3, root first
    tensor([[ 0,  2, -1],
            [ 0,  1,  3]])
    """
    return TreeMasks(*torch.ops.specdec.build_tree_masks(parents, prefix_lens))


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


def build_lookahead_masks(
    window: Tensor, levels: Tensor, tree_nodes: int, num_rows: int
) -> LookaheadMasks:
    """Attention masks and positions of the rows of a lookahead window (Jacobi guesses run in
    the same forward as a verification tree, never verified or committed).

    The block of request ``b`` is its verification tree (``tree_nodes`` columns, node 0 the
    root: the pending token) followed by ``num_rows`` window rows. The window has
    ``levels[b]`` levels of ``window[b]`` columns; cell ``(l, i)`` is a guess for the token
    ``i + l`` positions after the root. Cell ``(0, 0)`` is the root itself; every other cell
    is window row ``r = l * window[b] + i - 1`` (block column ``tree_nodes + r``), so a request
    uses ``window[b] * levels[b] - 1`` rows and the rest are padding. Row ``(l, i)`` attends to
    the causal sequence root, ``(0, 1), ..., (0, i), (1, i), ..., (l, i)``: its level-0 prefix,
    then its own column, as in lookahead decoding (Fu et al., 2024). The committed prefix is
    visible to every row and is not part of the mask. Rows never see tree nodes other than the
    root, and tree rows (built by :func:`build_tree_masks`) never see window rows.

    Parameters
    ----------
    window : Tensor
        ``[B]`` int32/int64 columns ``W`` of each request's window (``>= 0``).
    levels : Tensor
        ``[B]`` of the same dtype: levels ``L`` of each window (``>= 0``; 0 gives no rows).
    tree_nodes : int
        ``T``: columns of the verification tree before the window rows (``>= 1`` when any
        request has window rows).
    num_rows : int
        ``R``: window rows in the block, at least ``max(W * L - 1)``.

    Returns
    -------
    LookaheadMasks
        ``mask [B, R, T + R]`` bool, ``packed_mask [B, R, ceil((T + R) / 32)]`` int32 and
        ``positions [B, R]`` int64 (offsets from the root's position: ``l + i``; ``-1`` for
        padding rows, whose mask holds only themselves).

    Raises
    ------
    ValueError
        Bad shapes or dtypes, negative sizes, a window that needs more than ``num_rows`` rows,
        or window rows without a tree root (``tree_nodes = 0``).

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> # a window of 3 columns and 2 levels after a tree of one node (the root): 5 rows
    >>> masks = ops.build_lookahead_masks(torch.tensor([3]), torch.tensor([2]), 1, 5)
    >>> masks.positions  # cells (0, 1), (0, 2), (1, 0), (1, 1), (1, 2): level + column
    tensor([[1, 2, 1, 2, 3]])
    >>> masks.mask[0].int()  # columns: the root, then the 5 window rows
    tensor([[1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 0, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 1]], dtype=torch.int32)
    """
    return LookaheadMasks(
        *torch.ops.specdec.build_lookahead_masks(window, levels, int(tree_nodes), int(num_rows))
    )


@torch.library.register_fake("specdec::build_lookahead_masks")
def _build_lookahead_masks_fake(window, levels, tree_nodes, num_rows):
    batch = window.shape[0]
    columns = tree_nodes + num_rows
    return (
        window.new_empty((batch, num_rows, columns), dtype=torch.bool),
        window.new_empty((batch, num_rows, (columns + 31) // 32), dtype=torch.int32),
        window.new_empty((batch, num_rows), dtype=torch.int64),
    )


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    tree_mask: Tensor,
    scale: float | None = None,
    *,
    validate: bool = False,
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
        ``cache_lens[b] + j``. On CPU, under float32 ``q``, both may also be bfloat16 or
        float16 (half the bytes read per key; widened to float32 exactly where they are used,
        so the result is the bits of their float32 copy). ``Hq`` must be a multiple of ``Hkv`` (GQA/MQA: query head ``i``
        reads KV head ``i // (Hq // Hkv)``).
    cache_lens : Tensor
        ``[B]`` int32/int64 prefix length of each request; ``cache_lens[b] + T <= S``.
    tree_mask : Tensor
        ``[B, T, ceil(T / 32)]`` int32 bit-packed mask (``build_tree_masks(...).packed_mask`` or
        :func:`specdec_kernels.tree.pack_tree_mask`); bits of node columns ``>= T`` (the last
        word's padding) are ignored.
    scale : float, optional
        Softmax scale; default ``D ** -0.5``.
    validate : bool
        Check ``0 <= cache_lens[b]`` and ``cache_lens[b] + T <= S`` before launching. The CPU
        kernel always does; on CUDA it costs one device-to-host copy (a host sync), so it is
        off by default there: the kernels then clamp each length into ``[0, S - T]`` (nothing
        outside the cache is read; the result for such a request is unspecified). Not allowed
        during CUDA graph capture.

    Returns
    -------
    Tensor
        ``[B, T, Hq, D]`` contiguous, dtype of ``q``. A row that sees no key is zero.

    Raises
    ------
    ValueError
        Shapes, dtypes or devices that disagree, head counts not divisible, a mask whose shape
        does not match ``T``; with ``validate`` (always on CPU) a cache too short for prefix +
        tree or a negative length.

    Notes
    -----
    On CPU the result is batch-invariant: each row's output depends only on its own query and
    the keys and values it sees, in cache order (exact maximum, exp-sums and value sums taken in
    key order, unseen keys contributing exact zeros), so a token's output is bit-identical
    whether it is verified in a tree of ``T`` tokens or decoded alone once its ancestors are
    committed.
    On CUDA nothing is copied to the host (unless ``validate``): the grid depends on shapes
    only and each block sizes its share of the keys from ``cache_lens`` on the device, so calls
    overlap with host work and need nothing special under graph capture.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops, reference
    >>> gen = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 2, 4, 8, generator=gen)  # B = 1, T = 2 tree tokens, 4 heads, D = 8
    >>> k_cache = torch.randn(1, 2, 16, 8, generator=gen)  # 2 KV heads (GQA), room for 16 rows
    >>> v_cache = torch.randn(1, 2, 16, 8, generator=gen)
    >>> cache_lens = torch.tensor([10])  # 10 prefix rows, the tree's K/V at rows 10 and 11
    >>> tree = ops.build_tree_masks(torch.tensor([[-1, 0]]), cache_lens)
    >>> out = ops.tree_attention(q, k_cache, v_cache, cache_lens, tree.packed_mask)
    >>> out.shape
    torch.Size([1, 2, 4, 8])
    >>> spec = reference.tree_attention(q, k_cache, v_cache, cache_lens, tree.packed_mask, 8**-0.5)
    >>> torch.allclose(out, spec, atol=1e-5)
    True
    """
    if tree_mask.dtype == torch.bool:
        raise ValueError(
            "tree_attention takes the bit-packed int32 mask [B, T, ceil(T / 32)]: pass "
            "build_tree_masks(...).packed_mask or specdec_kernels.tree.pack_tree_mask(mask)"
        )
    if scale is None:
        scale = q.shape[-1] ** -0.5 if q.dim() == 4 and q.shape[-1] > 0 else 1.0
    out = torch.ops.specdec.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, float(scale))
    if needs_host_check(validate, cache_lens):
        # After the op's own shape checks (nothing is written, so checking afterwards is safe).
        _check_cache_lens(cache_lens, q.shape[1], k_cache.shape[2])
    return out


@torch.library.register_fake("specdec::tree_attention")
def _tree_attention_fake(q, k_cache, v_cache, cache_lens, tree_mask, scale):
    return q.new_empty(q.shape)


def _check_cache_lens(cache_lens: Tensor, tokens: int, capacity: int) -> None:
    """The CPU kernel's cache_lens check (csrc/tree_common.h), on a host copy."""
    for b, n in enumerate(cache_lens.cpu().tolist()):
        if n < 0:
            raise ValueError(f"cache_lens[{b}] = {n} is negative")
        if n + tokens > capacity:
            raise ValueError(
                f"cache_lens[{b}] = {n} plus the T = {tokens} tree tokens exceeds the cache "
                f"length S = {capacity}: the cache is too short for prefix + tree"
            )
