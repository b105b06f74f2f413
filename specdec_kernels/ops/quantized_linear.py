"""Typed wrapper of the weight-only quantized linear op (``csrc/quantized_linear.cpp``,
``csrc/cuda/quantized_linear.cu``): ``x @ W.T + b`` with ``W`` at a GGUF file's precision.

The fake (meta) kernel is registered right after the wrapper; the executable specification is
:func:`specdec_kernels.reference.quantized_linear`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["quantized_linear"]


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
    code, chosen at run time like :func:`~specdec_kernels.ops.linear.small_batch_linear`; see
    :func:`~specdec_kernels.ops.build.cpu_isa`), then scaled and summed in float32 in one fixed
    order: a row's result is **bit-identical alone or in any batch** (batch-invariant). Results
    differ between instruction sets by rounding. On CUDA the same arithmetic runs through torch
    (dequantized weights, ``F.linear``).

    Parameters
    ----------
    x : Tensor
        ``[..., K]`` float32 or bfloat16.
    qweight : Tensor
        ``[N, K]`` int8 (signed values), or ``[N, K / 2]`` uint8 packed int4: in each block of
        32 values, byte ``j`` holds value ``j`` in its low nibble and value ``j + 16`` in its
        high nibble, both unsigned 0..15 (llama.cpp's ``Q4`` order). CPU only: group 32 in
        **panels** of 16 weight rows, ``[N / 16, K / 32, 256]`` uint8 (int4) or
        ``[N / 16, K / 32, 512]`` int8, byte ``64 j + 4 r + i`` of panel ``p`` and block ``b``
        being byte ``4 j + i`` of row ``16 p + r``'s block ``b``
        (:func:`specdec_kernels.models.quantized_weight.pack_panels`); one integer
        dot-product instruction then advances 16 outputs, about 2x faster at every M on
        AVX-512; the sums run in another order, so the bits differ from the row layout's,
        and are the same on every instruction set. Int8 panels also take groups of 16 (a GGUF
        ``Q6_K``'s sub-blocks), with two scales per row and block of 32.
    scales : Tensor
        ``[N, K / G]`` float32 or float16; the group ``G`` is a power of two, at least 16 for
        int8 and 32 for int4. Panels: ``[N / 16, K / 32, 16]``, entry ``r`` for row ``16 p + r``;
        int8 panels in groups of 16: ``[N / 16, K / 32, 32]``, entry ``16 h + r`` for the
        block's half ``h`` (no ``mins``). Panels also take a K-quant file's own form (GGUF
        ``Q4_K``, ``Q5_K``, ``Q6_K``; ``K`` a multiple of 256): int8 ``[N / 16, K / 256,
        8 E + 32]`` with ``E`` the entries of a block above (16 or 32), per super-block of 8
        blocks their int8 sub-scales (block ``j``'s at bytes ``E j ..``) and then the 16 rows'
        float16 super-scale ``d`` (bytes ``8 E + 2 r``): scale ``= d * sub``, ``min = -(dmin *
        sub)``, exact in float32, so the bits are those of the float32 scales they encode
        (:func:`specdec_kernels.reference.expand_kquant_scales`), in about a sixth of the bytes.
    mins : Tensor, optional
        Same shape and dtype as ``scales``; zero when omitted.
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

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> gen = torch.Generator().manual_seed(0)
    >>> x = torch.randn(3, 64, generator=gen)
    >>> q = torch.randint(-127, 128, (8, 64), generator=gen, dtype=torch.int8)
    >>> scales = torch.full((8, 2), 0.01)  # groups of 32 along K
    >>> y = ops.quantized_linear(x, q, scales)
    >>> torch.equal(y[1:2], ops.quantized_linear(x[1:2], q, scales))  # a row alone: same bits
    True
    >>> exact = x @ (q.float() * 0.01).T
    >>> bool(((y - exact).abs() <= 0.02 * exact.abs().max()).all())  # activations are int8
    True
    """
    return torch.ops.specdec.quantized_linear(x, qweight, scales, mins, bias)


@torch.library.register_fake("specdec::quantized_linear")
def _quantized_linear_fake(x, qweight, scales, mins=None, bias=None):
    torch._check(x.dim() >= 1 and qweight.dim() in (2, 3), lambda: "x [..., K] and qweight [N, K']")
    if qweight.dim() == 3:  # panels [N / 16, K / 32, 256 or 512]
        torch._check(qweight.shape[1] * 32 == x.shape[-1], lambda: "x and qweight disagree on K")
        return x.new_empty((*x.shape[:-1], qweight.shape[0] * 16))
    packed = 2 if qweight.dtype == torch.uint8 else 1
    torch._check(qweight.shape[1] * packed == x.shape[-1], lambda: "x and qweight disagree on K")
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))
