"""Typed Python wrappers of ``torch.ops.specdec.*`` and their fake (meta) kernels.

Each wrapper documents shapes and semantics; the executable specification of the same op is
the function of the same name in :mod:`specdec_kernels.reference`. Index tensors are int32 or
int64 (one dtype per call) and live on the device of the data they index.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence, Union

import torch
from torch import Tensor

from specdec_kernels.sampling import SamplingParams

CacheList = Union[Tensor, Sequence[Tensor]]

__all__ = [
    "as_cache_list",
    "compact_kv_cache_",
    "compact_paged_kv_cache_",
    "cpu_isa",
    "deferred_errors",
    "raise_deferred_errors",
    "rollback_paged_kv_cache_",
    "sample",
    "sample_with_probs",
    "small_batch_linear",
    "quantized_linear",
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


def _needs_host_check(validate: bool, *tensors: Tensor) -> bool:
    """Whether to check index values on the host before a CUDA launch: only when the caller asks
    (the CPU kernels always check, for free). A host copy is impossible during graph capture."""
    if not validate or all(t.device.type == "cpu" for t in tensors):
        return False
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError("validate=True copies index values to the host, which CUDA graph "
                         "capture does not allow; validate outside the captured region")
    return True


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
    """
    cache_list = as_cache_list(caches)
    if _needs_host_check(validate, cache_lens, accept_positions, num_accepted):
        torch.ops.specdec.compact_kv_cache_(
            _stand_in_caches(cache_list, 1), cache_lens.cpu().clone(), accept_positions.cpu(),
            num_accepted.cpu(),
        )
    torch.ops.specdec.compact_kv_cache_(cache_list, cache_lens, accept_positions, num_accepted)


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
    """
    cache_list = as_cache_list(caches)
    if validate:
        host = [t.cpu() for t in (block_tables, cache_lens, accept_positions, num_accepted)]
        if _needs_host_check(validate, block_tables, cache_lens, accept_positions, num_accepted):
            torch.ops.specdec.compact_paged_kv_cache_(
                _stand_in_caches(cache_list, 2), host[0], host[1].clone(), host[2], host[3]
            )
        if cache_list and cache_list[0].dim() == 4 and block_tables.dim() == 2:
            _check_written_blocks_not_shared(host[0], cache_list[0].shape[1], host[1], host[3])
    torch.ops.specdec.compact_paged_kv_cache_(
        cache_list, block_tables, cache_lens, accept_positions, num_accepted
    )


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
    """
    if _needs_host_check(validate, block_tables, cache_lens, new_lens):
        tables = block_tables.cpu().clone()
        torch.ops.specdec.rollback_paged_kv_cache_(
            tables, cache_lens.cpu().clone(), new_lens.cpu(), block_size, torch.empty_like(tables)
        )
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
#   host, a synchronisation); under deferred_errors() the copy is asynchronous and the check
#   waits for raise_deferred_errors() (see there). While a CUDA graph is being captured no check
#   is possible. Whenever a check is not made at the call, a request with an error gets
#   num_accepted = 0 and all tokens -1 (sample: token -1, probabilities 0).
# * Agreement: CPU and reference compute bit-identical weights and accumulate long sums in
#   double (mostly in the same order), so their decisions agree (a difference needs a double
#   sum within ~1e-16 of a float32 rounding boundary). CUDA computes the same weights and sums
#   them with error-free float transformations per thread and in double across threads, or as
#   exact integers (top-p radix masses), in a fixed order: it is deterministic, and differs from
#   the CPU only when a long sum lands within ~1e-13 (relative) of a float32 rounding boundary.


@contextlib.contextmanager
def deferred_errors() -> Iterator[None]:
    """Defer the value-error checks of the CUDA sampling and verification ops (this thread).

    By default a CUDA call copies its per-request error codes to the host after the kernel, a
    synchronisation that stalls the CPU until the GPU has finished. Inside this context the copy
    is asynchronous and nothing waits: outputs of a request with an error are ``num_accepted =
    0`` and tokens ``-1`` (``sample``: token ``-1``, probabilities 0), and the error is raised,
    with the usual message, by :func:`raise_deferred_errors` (or, if more than 64 calls go
    unchecked, by the 65th). Call it after the synchronisation you make anyway (e.g. reading
    the tokens): the codes have landed by then and the check costs no wait. CPU ops always raise
    at the call. Nests; restores the previous setting on exit.
    """
    previous = torch.ops.specdec.set_deferred_errors(True)
    try:
        yield
    finally:
        torch.ops.specdec.set_deferred_errors(previous)


def raise_deferred_errors() -> None:
    """Check the calls made under :func:`deferred_errors` since the last check, in call order.

    Raises
    ------
    ValueError
        The first request error of the first call that had one (the others are dropped).
    """
    torch.ops.specdec.raise_deferred_errors()


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

    Notes
    -----
    Greedy trees whose siblings repeat a token: this op takes the longest matching path, so
    the output is the same whichever copy a drafter put first. SpecInfer-style verifiers (e.g.
    sgl-kernel's ``verify_tree_greedy``) walk the siblings in order and take the *first* match,
    which can accept fewer drafts; :func:`specdec_kernels.compat.sgl_kernel.verify_tree_greedy`
    follows that rule (it drops repeated siblings after their first copy before calling this
    op). Both emit the target's greedy tokens; only the number accepted per step differs.
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

__all__ += ["LookaheadMasks", "TreeMasks", "build_lookahead_masks", "build_tree_masks",
            "tree_attention"]


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


class LookaheadMasks(NamedTuple):
    """Outputs of :func:`build_lookahead_masks` (``B`` requests, ``R`` window rows after ``T``
    tree nodes)."""

    mask: Tensor
    """``[B, R, T + R]`` bool: ``mask[b, r, k]`` iff window row ``r`` attends to block column
    ``k`` (tree node ``k < T``, window row ``k - T`` otherwise)."""
    packed_mask: Tensor
    """``[B, R, ceil((T + R) / 32)]`` int32: ``mask`` bit-packed like :class:`TreeMasks`."""
    positions: Tensor
    """``[B, R]`` int64: each row's position after the root's (``-1`` on padding rows)."""


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
    """
    return LookaheadMasks(
        *torch.ops.specdec.build_lookahead_masks(window, levels, int(tree_nodes), int(num_rows))
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
        ``cache_lens[b] + j``. ``Hq`` must be a multiple of ``Hkv`` (GQA/MQA: query head ``i``
        reads KV head ``i // (Hq // Hkv)``).
    cache_lens : Tensor
        ``[B]`` int32/int64 prefix length of each request; ``cache_lens[b] + T <= S``.
    tree_mask : Tensor
        ``[B, T, ceil(T / 32)]`` int32 bit-packed mask (``build_tree_masks(...).packed_mask`` or
        :func:`specdec_kernels.tree.pack_tree_mask`).
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
    """
    if tree_mask.dtype == torch.bool:
        raise ValueError(
            "tree_attention takes the bit-packed int32 mask [B, T, ceil(T / 32)]: pass "
            "build_tree_masks(...).packed_mask or specdec_kernels.tree.pack_tree_mask(mask)"
        )
    if scale is None:
        scale = q.shape[-1] ** -0.5 if q.dim() == 4 and q.shape[-1] > 0 else 1.0
    out = torch.ops.specdec.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, float(scale))
    if _needs_host_check(validate, cache_lens):
        # After the op's own shape checks (nothing is written, so checking afterwards is safe).
        _check_cache_lens(cache_lens, q.shape[1], k_cache.shape[2])
    return out


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


# ----------------------------------------------------------------------------- small-batch linear


def small_batch_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``x @ weight.T + bias`` for the few rows of a decoding or verification forward.

    On CPU, the package's kernel: each weight row is read once for all rows of ``x`` and every
    output element is reduced in one fixed order (float32 accumulation, lane by lane over
    ``K``, then a fixed reduction tree, then the bias), whatever the number of rows and however
    they are split over threads. A row's result is therefore **bit-identical whether it is
    computed alone or in a batch** (batch-invariant). Built for the few rows of decoding, where
    it costs about one row's time until the FMA units become the limit; larger batches are cut
    into passes of 128 rows (measured here: as fast as torch's GEMM up to 512 rows). AVX-512 (with ``vdpbf16ps`` for bfloat16 where present), AVX2/FMA or portable code is
    chosen at run time (:func:`cpu_isa`); results differ between those levels by rounding. On
    CUDA it calls ``torch.nn.functional.linear``.

    Parameters
    ----------
    x : Tensor
        ``[..., K]`` float32 or bfloat16.
    weight : Tensor
        ``[N, K]``, same dtype and device as ``x`` (rows with unit column stride; other layouts
        are copied).
    bias : Tensor, optional
        ``[N]``, same dtype and device.

    Returns
    -------
    Tensor
        ``[..., N]`` in the dtype of ``x`` (float32 accumulation, rounded once).

    Raises
    ------
    ValueError
        Shapes that do not match, mixed or unsupported dtypes (float16 is not supported on
        CPU), tensors on different devices.
    """
    return torch.ops.specdec.small_batch_linear(x, weight, bias)


def cpu_isa(cap: Optional[str] = None) -> str:
    """The instruction set the CPU kernels use: ``"avx512_bf16"``, ``"avx512"``, ``"avx2"`` or
    ``"portable"``.

    Parameters
    ----------
    cap : str, optional
        Cap the level for this process (one of the names above, or ``"none"`` to lift the
        cap); used by tests to run every code path on one machine. The environment variable
        ``SPECDEC_CPU_ISA`` sets the same cap at start-up.

    Returns
    -------
    str
        The level in effect (after the cap).
    """
    if cap is None:
        return torch.ops.specdec.cpu_isa(-2)
    levels = {"none": -1, "portable": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3}
    if cap not in levels:
        raise ValueError(f"cap must be one of {sorted(levels)}, got {cap!r}")
    return torch.ops.specdec.cpu_isa(levels[cap])


@torch.library.register_fake("specdec::small_batch_linear")
def _small_batch_linear_fake(x, weight, bias=None):
    torch._check(x.dim() >= 1 and weight.dim() == 2, lambda: "x [..., K] and weight [N, K]")
    torch._check(x.shape[-1] == weight.shape[1], lambda: "x and weight disagree on K")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("specdec::build_lookahead_masks")
def _build_lookahead_masks_fake(window, levels, tree_nodes, num_rows):
    batch = window.shape[0]
    columns = tree_nodes + num_rows
    return (
        window.new_empty((batch, num_rows, columns), dtype=torch.bool),
        window.new_empty((batch, num_rows, (columns + 31) // 32), dtype=torch.int32),
        window.new_empty((batch, num_rows), dtype=torch.int64),
    )


# ----------------------------------------------------------------------------- quantized linear
# (issue 23; kept as one block so it moves in one piece into the ops package)


def quantized_linear(
    x: Tensor,
    qweight: Tensor,
    scales: Tensor,
    mins: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
) -> Tensor:
    """``x @ W.T + bias`` with ``W`` held at a GGUF file's precision: int8 or int4 values in
    groups along ``K``, ``W[n, k] = scales[n, g] * q[n, k] + mins[n, g]`` for ``g = k // G``.

    On CPU each row of ``x`` is quantized to int8 in blocks of 32 values (scale ``amax / 127``,
    round half to even; :func:`specdec_kernels.reference.quantize_activations`) and multiplied
    with integer dot products (AVX-512 VNNI ``vpdpbusd``, AVX2 ``vpmaddubsw``, or portable
    code, chosen at run time like :func:`small_batch_linear`; see :func:`cpu_isa`), then
    scaled and summed in float32 in one fixed order: a row's result is **bit-identical alone
    or in any batch** (batch-invariant). Results differ between instruction sets by rounding.
    On CUDA the same arithmetic runs through torch (dequantized weights, ``F.linear``).

    Parameters
    ----------
    x : Tensor
        ``[..., K]`` float32 or bfloat16.
    qweight : Tensor
        ``[N, K]`` int8 (signed values), or ``[N, K / 2]`` uint8 packed int4: in each block of
        32 values, byte ``j`` holds value ``j`` in its low nibble and value ``j + 16`` in its
        high nibble, both unsigned 0..15 (llama.cpp's ``Q4`` order).
    scales : Tensor
        ``[N, K / G]`` float32 or float16; the group ``G`` is a power of two, at least 16 for
        int8 and 32 for int4.
    mins : Tensor, optional
        ``[N, K / G]``, same dtype as ``scales``; zero when omitted.
    bias : Tensor, optional
        ``[N]`` in ``x``'s dtype.

    Returns
    -------
    Tensor
        ``[..., N]`` in ``x``'s dtype.

    Raises
    ------
    ValueError
        Shapes that do not match, a group that is not a power of two of the minimum size,
        unsupported dtypes, tensors on different devices.
    """
    return torch.ops.specdec.quantized_linear(x, qweight, scales, mins, bias)


@torch.library.register_fake("specdec::quantized_linear")
def _quantized_linear_fake(x, qweight, scales, mins=None, bias=None):
    torch._check(x.dim() >= 1 and qweight.dim() == 2, lambda: "x [..., K] and qweight [N, K']")
    packed = 2 if qweight.dtype == torch.uint8 else 1
    torch._check(qweight.shape[1] * packed == x.shape[-1], lambda: "x and qweight disagree on K")
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))
