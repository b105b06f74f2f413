"""Typed wrapper of the small-batch linear op (``csrc/linear.cpp``, ``csrc/cuda/linear.cu``):
the batch-invariant ``x @ W.T + b`` of decoding and verification forwards.

The fake (meta) kernel is registered right after the wrapper; the executable specification is
:func:`specdec_kernels.reference.small_batch_linear`. The instruction set the CPU kernel runs
is :func:`specdec_kernels.ops.build.cpu_isa`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["small_batch_linear"]


def small_batch_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``x @ weight.T + bias`` for the few rows of a decoding or verification forward.

    On CPU, the package's kernel: each weight row is read once for all rows of ``x`` and every
    output element is reduced in one fixed order (float32 accumulation, lane by lane over
    ``K``, then a fixed reduction tree, then the bias), whatever the number of rows and however
    they are split over threads. A row's result is therefore **bit-identical whether it is
    computed alone or in a batch** (batch-invariant). Built for the few rows of decoding, where
    it costs about one row's time until the FMA units become the limit; larger batches are cut
    into passes of 128 rows (measured here: as fast as torch's GEMM up to 512 rows). AVX-512
    (with ``vdpbf16ps`` for bfloat16 where present), AVX2/FMA or portable code is chosen at
    run time (:func:`~specdec_kernels.ops.build.cpu_isa`); results differ between those
    levels by rounding. On CUDA it calls ``torch.nn.functional.linear``.

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

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> gen = torch.Generator().manual_seed(0)
    >>> x, weight = torch.randn(5, 64, generator=gen), torch.randn(16, 64, generator=gen)
    >>> y = ops.small_batch_linear(x, weight)
    >>> torch.equal(y[2:3], ops.small_batch_linear(x[2:3], weight))  # a row alone: same bits
    True
    >>> torch.allclose(y, x @ weight.T, atol=1e-4)
    True
    """
    return torch.ops.specdec.small_batch_linear(x, weight, bias)


@torch.library.register_fake("specdec::small_batch_linear")
def _small_batch_linear_fake(x, weight, bias=None):
    torch._check(x.dim() >= 1 and weight.dim() == 2, lambda: "x [..., K] and weight [N, K]")
    torch._check(x.shape[-1] == weight.shape[1], lambda: "x and weight disagree on K")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
