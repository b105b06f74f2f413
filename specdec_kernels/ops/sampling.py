"""Typed wrappers of the sampling ops (``csrc/sampling.cpp``, ``csrc/cuda/sampling.cu``) and the
switch that defers their CUDA error checks; the verification ops (:mod:`.verify`) share the
processing, the random streams and the error handling described here.

Each wrapper's fake (meta) kernel is registered right after it; the executable specification
is the function of the same name in :mod:`specdec_kernels.reference`.

Processing, uniforms and decision rules, in one place (kernels: csrc/cuda/kernels/
sampling.cuh, philox.cuh, verify.cuh; executable spec: specdec_kernels.reference):

* Processed distribution p of a row of logits l[0..V) (float32 arithmetic): temperature 0 is
  greedy (one-hot at argmax, ties to the lowest id). Otherwise w(x) = exp((l(x) - max l) *
  (1 / T)) (a fixed float32 exp shared by every implementation), then top-k keeps l(x) >= the k-th
  largest logit (ties kept), top-p keeps, among those, l(x) >= the largest logit whose
  mass-at-or-above reaches top_p of their mass, min-p keeps w(x) >= min_p;
  p(x) = w(x) / (kept mass) on kept tokens. No vocabulary sort: thresholds come from a radix
  select over the logits.
* Uniforms: Philox4x32-10 keyed by seed[b], counter (offset[b], position, stream), values
  k * 2^-24 in [0, 1) (never 1). Position is a node index (chain: row i = node i, draft i =
  node i + 1); ops.sample and the verify ops use different streams.
* Draws are inverse-CDF: the smallest token whose cumulative weight exceeds u * total.
* Rejection sampling accepts draft x iff q(x) > 0 and u * q(x) < v(x) (v: the current target
  distribution, p at first): u = 0 accepts any x with v(x) > 0, q(x) = 0 always rejects.
  After a rejection v <- normalize(max(0, v - q)) (one-hot q: x's mass removed); an all-zero
  residual falls back to p.
* Errors (ValueError naming the request): invalid parameters, num_draft outside [0, K],
  malformed trees, draft ids outside [0, V), draft_probs at the drafted token outside [0, 1],
  NaN/+Inf logits or a row without a finite value (-Inf is allowed) in any row the request
  owns (chain: rows 0..num_draft[b]; tree: non-padding nodes), whatever the random decisions.
  On CUDA they are detected on the device and raised after the kernel (one small copy to the
  host, a synchronisation); under deferred_errors() the copy is asynchronous and the check
  waits for raise_deferred_errors() (see there). While a CUDA graph is being captured no check
  is possible. Whenever a check is not made at the call, a request with an error gets
  num_accepted = 0 and all tokens -1 (sample: token -1, probabilities 0).
* Agreement: CPU and reference compute bit-identical weights and accumulate long sums in
  double (mostly in the same order), so their decisions agree (a difference needs a double
  sum within ~1e-16 of a float32 rounding boundary). CUDA computes the same weights and sums
  them with error-free float transformations per thread and in double across threads, or as
  exact integers (top-p radix masses), in a fixed order: it is deterministic, and differs from
  the CPU only when a long sum lands within ~1e-13 (relative) of a float32 rounding boundary.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import Tensor

from specdec_kernels.sampling import SamplingParams

__all__ = ["deferred_errors", "raise_deferred_errors", "sample", "sample_with_probs"]


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

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> logits = torch.tensor([[0.0, 3.0, 1.0]])
    >>> with ops.deferred_errors():
    ...     tokens = ops.sample(logits, SamplingParams.create(1))
    ...     host = tokens.tolist()  # the synchronisation the caller makes anyway
    ...     ops.raise_deferred_errors()  # then the check costs no wait
    >>> host
    [1]
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

    Examples
    --------
    >>> from specdec_kernels import ops
    >>> ops.raise_deferred_errors()  # no call left unchecked: nothing to raise
    """
    torch.ops.specdec.raise_deferred_errors()


def offsets_or_zeros(offset: Optional[Tensor], batch: int, device) -> Tensor:
    if offset is None:
        return torch.zeros(batch, dtype=torch.int64, device=device)
    return offset


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

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    >>> ops.sample(logits, SamplingParams.create(2))  # temperature 0: the argmax
    tensor([1, 0])
    >>> params = SamplingParams.create(2, temperature=0.7, top_k=2, seed=[11, 12])
    >>> offset = torch.tensor([4, 4])  # e.g. tokens generated so far
    >>> first = ops.sample(logits, params, offset)
    >>> torch.equal(first, ops.sample(logits, params, offset))  # same seed and offset: same draw
    True
    """
    return torch.ops.specdec.sample(
        logits, *params.tensors(), offsets_or_zeros(offset, logits.shape[0], logits.device)
    )


@torch.library.register_fake("specdec::sample")
def _sample_fake(logits, temperature, top_k, top_p, min_p, seed, offset):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


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

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> rows = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 1.0]])
    >>> params = SamplingParams.create(2, temperature=1.0, top_k=2)
    >>> tokens, probs = ops.sample_with_probs(rows, params)
    >>> (probs > 0).sum(-1)  # top-k = 2 keeps two tokens per row
    tensor([2, 2])
    >>> bool(probs.gather(1, tokens[:, None]).gt(0).all())  # each token drawn from its row's probs
    True
    """
    return torch.ops.specdec.sample_with_probs(
        logits, *params.tensors(), offsets_or_zeros(offset, logits.shape[0], logits.device)
    )


@torch.library.register_fake("specdec::sample_with_probs")
def _sample_with_probs_fake(logits, temperature, top_k, top_p, min_p, seed, offset):
    return (
        logits.new_empty((logits.shape[0],), dtype=torch.int64),
        logits.new_empty(logits.shape, dtype=torch.float32),
    )
