"""The package's own small-batch linear layers on CPU, without touching the model.

Measured on this project's 2-core AMD EPYC machine (torch 2.13 CPU wheel), torch runs a float32
``F.linear(x, W)`` with one row as a matrix-vector product that streams ``W`` once, but 2 to 32
rows as a general matrix product that packs ``W`` on every call: verifying 8 tokens cost 1.5x
(SmolLM2-135M) to 2x (a Qwen2-1.5B shape) one token. Decoding and verification forwards have
exactly these shapes.

:class:`SmallBatchLinear` is a ``TorchFunctionMode`` (PyTorch's public interception point)
that sends CPU float32 / bfloat16 linears to :func:`specdec_kernels.ops.small_batch_linear`
while it is active; the engine enables it around its own CPU forwards. That kernel streams each
weight row once for all rows and reduces every output element in one fixed order, so a row's
result is bit-identical whatever the number of rows: with the tree-attention kernel, a
verification forward over K tokens yields exactly the logits that one-token decoding would.
Prefill forwards need no batch invariance: from some hundred rows on, torch's GEMM can be
faster, and :class:`SmallBatchLinear` leaves linears of that many rows to it (``gemm_rows``,
measured per machine by :mod:`~specdec_kernels.decoding.kernel_choice`).

Weights at a GGUF file's precision (:class:`~specdec_kernels.models.quantized_weight.QuantizedWeight`,
loaded by ``load_model(..., weights="file")``) go through the same doorway to
:func:`specdec_kernels.ops.quantized_linear`, batch-invariant as well, on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import QuantizedWeight

__all__ = ["SmallBatchLinear", "supports"]

_DTYPES = (torch.float32, torch.bfloat16)


def supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             max_rows: int | None = None) -> bool:
    """Whether ``F.linear(x, weight, bias)`` goes through the kernel: CPU, float32 or bfloat16
    throughout, at least one row (and at most ``max_rows``)."""
    if x.device.type != "cpu" or x.dtype not in _DTYPES or weight.dtype != x.dtype:
        return False
    if weight.device.type != "cpu" or weight.dim() != 2 or x.dim() < 1:
        return False
    if x.shape[-1] != weight.shape[1] or x.shape[-1] == 0:
        return False
    if bias is not None and (bias.dtype != x.dtype or bias.device.type != "cpu"):
        return False
    rows = x.numel() // x.shape[-1]
    return rows >= 1 and (max_rows is None or rows <= max_rows)


class SmallBatchLinear(TorchFunctionMode):
    """Route CPU float32 / bfloat16 ``F.linear`` calls through
    :func:`specdec_kernels.ops.small_batch_linear`, and linears on quantized weights through
    :func:`specdec_kernels.ops.quantized_linear`.

    Parameters
    ----------
    gemm_rows : int, optional
        Leave linears of at least this many rows to torch's GEMM (default: none left). Only
        for forwards whose rows need not be batch-invariant (prefill).
    """

    def __init__(self, gemm_rows: int | None = None):
        super().__init__()
        if gemm_rows is not None and gemm_rows < 2:
            raise ValueError(f"gemm_rows must be >= 2 or None, got {gemm_rows}")
        self.max_rows = None if gemm_rows is None else gemm_rows - 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if isinstance(weight, QuantizedWeight):
                return weight.linear(x, bias)
            if supports(x, weight, bias, self.max_rows):
                return ops.small_batch_linear(x, weight, bias)
        return func(*args, **kwargs)
