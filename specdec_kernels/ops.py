"""Typed Python wrappers of ``torch.ops.specdec.*`` and their fake (meta) kernels.

Each wrapper documents shapes and semantics; the executable specification of the same op is
the function of the same name in :mod:`specdec_kernels.reference`. Index tensors are int32 or
int64 (one dtype per call) and live on the device of the data they index.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from specdec_kernels.sampling import SamplingParams

CacheList = Union[Tensor, Sequence[Tensor]]

__all__ = [
    "as_cache_list",
    "compact_kv_cache_",
    "compact_paged_kv_cache_",
    "rollback_paged_kv_cache_",
    "sample",
    "sample_with_probs",
    "typical_verify_chain",
    "typical_verify_tree",
    "verify_chain",
    "verify_tree",
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
#
# Processing, uniforms and decision rules, in one place (kernels: csrc/cuda/kernels/
# sampling.cuh, philox.cuh, verify.cuh; executable spec: specdec_kernels.reference):
#
# * Processed distribution p of a row of logits l[0..V) (float32 arithmetic): temperature 0 is
#   greedy (one-hot at argmax, ties to the lowest id). Otherwise w(x) = exp((l(x) - max l) *
#   (1 / T)) (a fixed float32 exp shared by every implementation), then top-k keeps l(x) >= the k-th
#   largest logit (ties kept), top-p keeps, among those, l(x) >= the largest logit whose
#   mass-at-or-above reaches top_p of their mass, min-p keeps w(x) >= min_p;
#   p(x) = w(x) / (kept mass) on kept tokens. No vocabulary sort: thresholds come from a radix
#   select over the logits.
# * Uniforms: Philox4x32-10 keyed by seed[b], counter (offset[b], position, stream), values
#   k * 2^-24 in [0, 1) (never 1). Position is a node index (chain: row i = node i, draft i =
#   node i + 1); ops.sample and the verify ops use different streams.
# * Draws are inverse-CDF: the smallest token whose cumulative weight exceeds u * total.
# * Rejection sampling accepts draft x iff q(x) > 0 and u * q(x) < v(x) (v: the current target
#   distribution, p at first): u = 0 accepts any x with v(x) > 0, q(x) = 0 always rejects.
#   After a rejection v <- normalize(max(0, v - q)) (one-hot q: x's mass removed); an all-zero
#   residual falls back to p.
# * Errors (ValueError naming the request): invalid parameters, num_draft outside [0, K],
#   malformed trees, draft ids outside [0, V), draft_probs at the drafted token outside [0, 1],
#   NaN/+Inf logits or a row without a finite value (-Inf is allowed) in any row the request
#   owns (chain: rows 0..num_draft[b]; tree: non-padding nodes), whatever the random decisions.
#   On CUDA they are detected on the device and raised after the kernel (one small copy to the
#   host), except while a CUDA graph is being captured: then no check is possible, and a
#   request with an error gets num_accepted = 0 and all tokens -1.
# * Agreement: CPU and reference compute bit-identical weights and accumulate long sums in
#   double (mostly in the same order), so their decisions agree (a difference needs a double
#   sum within ~1e-16 of a float32 rounding boundary); CUDA sums in float/double in another
#   order, so a decision can differ only when a uniform lands within float32 rounding of its
#   threshold (probability ~1e-7 per decision).


def _offsets(offset: Optional[Tensor], batch: int, device) -> Tensor:
    if offset is None:
        return torch.zeros(batch, dtype=torch.int64, device=device)
    return offset


def _int64(t: Tensor) -> Tensor:
    return t if t.dtype == torch.int64 else t.long()


def sample(logits: Tensor, params: SamplingParams, offset: Optional[Tensor] = None) -> Tensor:
    """Draw one token per row of logits from the processed distribution.

    Temperature 0 rows take the argmax (ties to the lowest id); other rows apply temperature,
    top-k, top-p and min-p (see :class:`~specdec_kernels.sampling.SamplingParams`) and draw by
    inverse CDF with the uniform of ``(seed[n], offset[n], position 0)``. Deterministic for a
    given seed and offset, independent of the rest of the batch. This is the same processing the
    verification ops apply to the target logits.

    Parameters
    ----------
    logits : Tensor
        ``[N, V]`` float32, float16 or bfloat16, contiguous.
    params : SamplingParams
        ``[N]`` per-row parameters on the logits' device.
    offset : Tensor, optional
        ``[N]`` int64 Philox counter per row (e.g. tokens generated so far); zeros if omitted.

    Returns
    -------
    Tensor
        ``[N]`` int64 token ids.

    Raises
    ------
    ValueError
        Invalid parameters, or a row with NaN/+Inf or without a finite logit.
    """
    return torch.ops.specdec.sample(
        logits, *params.tensors(), _offsets(offset, logits.shape[0], logits.device)
    )


def sample_with_probs(
    logits: Tensor, params: SamplingParams, offset: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """:func:`sample`, also returning the processed distribution each token was drawn from.

    Drafters pass these distributions to :func:`verify_chain` / :func:`verify_tree` as
    ``draft_probs``, so the draft's q is exactly the distribution it sampled from.

    Parameters
    ----------
    logits : Tensor
        ``[N, V]`` float32, float16 or bfloat16.
    params : SamplingParams
        ``[N]`` per-row parameters.
    offset : Tensor, optional
        ``[N]`` int64 Philox counter per row.

    Returns
    -------
    tokens : Tensor
        ``[N]`` int64.
    probs : Tensor
        ``[N, V]`` float32 processed distribution (one-hot at the argmax for greedy rows).
    """
    return torch.ops.specdec.sample_with_probs(
        logits, *params.tensors(), _offsets(offset, logits.shape[0], logits.device)
    )


def verify_chain(
    draft_tokens: Tensor,
    num_draft: Optional[Tensor],
    target_logits: Tensor,
    draft_probs: Optional[Tensor],
    params: SamplingParams,
    offset: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Verify a chain of drafts per request against the target's logits, in one launch.

    Greedy requests (temperature 0) accept drafts while each equals the target argmax, then
    emit the argmax at the first mismatch (or after the last draft). Sampling requests use
    lossless rejection sampling on the processed target distribution p_i of row i: draft x_i
    (drafted from q_i) is accepted iff ``q_i(x_i) > 0 and u * q_i(x_i) < p_i(x_i)``; at the first
    rejection the next token is drawn from ``normalize(max(0, p_i - q_i))`` (from p_i if that is
    all zero); if every draft is accepted a bonus token is drawn from p_K. The emitted tokens
    are distributed exactly as the target's own samples. Greedy and sampling requests may
    share a batch; rows past ``num_draft[b]`` are never read.

    Parameters
    ----------
    draft_tokens : Tensor
        ``[B, K]`` int64 (int32 is converted) draft ids; columns ``>= num_draft[b]`` are ignored.
    num_draft : Tensor, optional
        ``[B]`` number of valid drafts per request, in ``[0, K]``; ``K`` for all if omitted.
    target_logits : Tensor
        ``[B, K+1, V]`` float32/float16/bfloat16: row i is the target's output at the position
        whose next token is draft i (row K: after the last draft).
    draft_probs : Tensor, optional
        ``[B, K, V]`` float32: the distribution each draft was sampled from (e.g. from
        :func:`sample_with_probs`). ``None`` for deterministic drafters (n-gram, lookup): q is
        one-hot at the draft. Only the drafted token's entry is validated (in ``[0, 1]``); the
        rest is trusted to be a distribution (a NaN entry gives its token no residual mass).
    params : SamplingParams
        ``[B]`` per-request parameters, applied to the target logits (and assumed to be what
        produced ``draft_probs``).
    offset : Tensor, optional
        ``[B]`` int64 Philox counter per request; zeros if omitted. Advance it every step (e.g.
        by the tokens emitted) so steps draw fresh uniforms.

    Returns
    -------
    tokens : Tensor
        ``[B, K+1]`` int64: ``tokens[b, :num_accepted[b] + 1]`` are the accepted drafts then the
        correction or bonus token; the rest is -1.
    num_accepted : Tensor
        ``[B]`` int64 accepted drafts, in ``[0, num_draft[b]]``.

    Raises
    ------
    ValueError
        Shapes/dtypes/devices, or per-request value errors (see the section comment above).
    """
    batch, k = draft_tokens.shape
    if num_draft is None:
        num_draft = torch.full((batch,), k, dtype=torch.int64, device=draft_tokens.device)
    return torch.ops.specdec.verify_chain(
        _int64(draft_tokens),
        _int64(num_draft),
        target_logits,
        draft_probs,
        *params.tensors(),
        _offsets(offset, batch, target_logits.device),
    )


def verify_tree(
    tree_tokens: Tensor,
    parents: Tensor,
    target_logits: Tensor,
    draft_probs: Optional[Tensor],
    params: SamplingParams,
    offset: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Verify a tree of drafts per request against the target's logits, in one launch.

    Greedy requests take the longest root-to-node path whose every token equals its parent's
    argmax (ties between equally long paths: the lowest final node index) and emit the argmax
    after it. Sampling requests use recursive rejection sampling (SpecInfer): at the current
    node the children are tried in index order against the current distribution v (first the
    node's processed target p); child c with token x is accepted iff
    ``q_c(x) > 0 and u * q_c(x) < v(x)``, and after a rejection v becomes
    ``normalize(max(0, v - q_c))`` (one-hot q_c when ``draft_probs`` is None: x's mass is
    removed). The first accepted child becomes the current node; when none is, the next token is
    drawn from v. Lossless for drafts drawn independently from their q (or fixed drafts).

    Parameters
    ----------
    tree_tokens : Tensor
        ``[B, T]`` int64 token of every node; node 0 is the root (the last accepted token,
        already emitted; its token is not read).
    parents : Tensor
        ``[B, T]`` int64 parent index of every node: ``-1`` at node 0, smaller than the node's
        own index elsewhere, ``-2`` on unused (padding) nodes of ragged trees.
    target_logits : Tensor
        ``[B, T, V]``: row j is the target's output at node j (predicts j's children).
    draft_probs : Tensor, optional
        ``[B, T, V]`` float32: row j is the distribution node j's token was drawn from (row 0
        unused). ``None`` for deterministic drafts.
    params : SamplingParams
        ``[B]`` per-request parameters.
    offset : Tensor, optional
        ``[B]`` int64 Philox counter per request.

    Returns
    -------
    accepted_nodes : Tensor
        ``[B, T]`` int64 accepted non-root nodes, root to leaf, -1 padded.
    tokens : Tensor
        ``[B, T]`` int64: ``tokens[b, :num_accepted[b] + 1]`` are their tokens followed by the
        next token; -1 padded.
    num_accepted : Tensor
        ``[B]`` int64 path length.

    Raises
    ------
    ValueError
        Malformed trees (root not at node 0 or several roots, a parent not before its child,
        which covers cycles, a parent that is padding), draft ids out of range, and the errors of
        :func:`verify_chain`.
    """
    return torch.ops.specdec.verify_tree(
        _int64(tree_tokens),
        _int64(parents),
        target_logits,
        draft_probs,
        *params.tensors(),
        _offsets(offset, tree_tokens.shape[0], target_logits.device),
    )


def typical_verify_chain(
    draft_tokens: Tensor,
    num_draft: Optional[Tensor],
    target_logits: Tensor,
    params: SamplingParams,
    offset: Optional[Tensor] = None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> tuple[Tensor, Tensor]:
    """Typical acceptance of a chain (Medusa). LOSSY: not the target's distribution.

    A draft x at row i is accepted iff ``p_i(x) > min(posterior_threshold, posterior_alpha *
    exp(-H(p_i)))`` with p_i the processed target distribution and H its entropy; drafts are
    accepted up to the first failure, then the next token is drawn from the last row's p
    (greedy requests behave as in :func:`verify_chain`). Draft probabilities are not used.

    Parameters
    ----------
    draft_tokens, num_draft, target_logits, params, offset
        As in :func:`verify_chain`.
    posterior_threshold : float
        Hard threshold epsilon (Medusa's default 0.09).
    posterior_alpha : float
        Entropy-scaled threshold delta (Medusa's default 0.3).

    Returns
    -------
    tokens : Tensor
        ``[B, K+1]`` int64, as in :func:`verify_chain`.
    num_accepted : Tensor
        ``[B]`` int64.
    """
    batch, k = draft_tokens.shape
    if num_draft is None:
        num_draft = torch.full((batch,), k, dtype=torch.int64, device=draft_tokens.device)
    return torch.ops.specdec.typical_verify_chain(
        _int64(draft_tokens),
        _int64(num_draft),
        target_logits,
        *params.tensors(),
        _offsets(offset, batch, target_logits.device),
        float(posterior_threshold),
        float(posterior_alpha),
    )


def typical_verify_tree(
    tree_tokens: Tensor,
    parents: Tensor,
    target_logits: Tensor,
    params: SamplingParams,
    offset: Optional[Tensor] = None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> tuple[Tensor, Tensor, Tensor]:
    """Typical acceptance over a tree (Medusa). LOSSY: not the target's distribution.

    A node passes iff its token x satisfies the rule of :func:`typical_verify_chain` on its
    parent's processed distribution; the result is the longest path of passing nodes (ties: the
    lowest final node index), then a token drawn from the last node's p (greedy requests: as in
    :func:`verify_tree`).

    Parameters
    ----------
    tree_tokens, parents, target_logits, params, offset
        As in :func:`verify_tree`.
    posterior_threshold, posterior_alpha : float
        As in :func:`typical_verify_chain`.

    Returns
    -------
    accepted_nodes, tokens, num_accepted : Tensor
        As in :func:`verify_tree`.
    """
    return torch.ops.specdec.typical_verify_tree(
        _int64(tree_tokens),
        _int64(parents),
        target_logits,
        *params.tensors(),
        _offsets(offset, tree_tokens.shape[0], target_logits.device),
        float(posterior_threshold),
        float(posterior_alpha),
    )


@torch.library.register_fake("specdec::sample")
def _sample_fake(logits, temperature, top_k, top_p, min_p, seed, offset):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


@torch.library.register_fake("specdec::sample_with_probs")
def _sample_with_probs_fake(logits, temperature, top_k, top_p, min_p, seed, offset):
    return (
        logits.new_empty((logits.shape[0],), dtype=torch.int64),
        logits.new_empty(logits.shape, dtype=torch.float32),
    )


def _chain_outputs_fake(draft_tokens):
    batch, k = draft_tokens.shape
    return (
        draft_tokens.new_empty((batch, k + 1), dtype=torch.int64),
        draft_tokens.new_empty((batch,), dtype=torch.int64),
    )


def _tree_outputs_fake(tree_tokens):
    batch, nodes = tree_tokens.shape
    return (
        tree_tokens.new_empty((batch, nodes), dtype=torch.int64),
        tree_tokens.new_empty((batch, nodes), dtype=torch.int64),
        tree_tokens.new_empty((batch,), dtype=torch.int64),
    )


@torch.library.register_fake("specdec::verify_chain")
def _verify_chain_fake(draft_tokens, num_draft, target_logits, draft_probs, *params):
    return _chain_outputs_fake(draft_tokens)


@torch.library.register_fake("specdec::verify_tree")
def _verify_tree_fake(tree_tokens, parents, target_logits, draft_probs, *params):
    return _tree_outputs_fake(tree_tokens)


@torch.library.register_fake("specdec::typical_verify_chain")
def _typical_verify_chain_fake(draft_tokens, num_draft, target_logits, *params):
    return _chain_outputs_fake(draft_tokens)


@torch.library.register_fake("specdec::typical_verify_tree")
def _typical_verify_tree_fake(tree_tokens, parents, target_logits, *params):
    return _tree_outputs_fake(tree_tokens)


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
