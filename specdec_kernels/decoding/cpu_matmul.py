"""The package's own small-batch linear layers on CPU, without touching the model.

Measured on this project's 2-core AMD EPYC machine (torch 2.13 CPU wheel), torch runs a float32
``F.linear(x, W)`` with one row as a matrix-vector product that streams ``W`` once, but 2 to 32
rows as a general matrix product that packs ``W`` on every call: verifying 8 tokens cost 1.5x
(SmolLM2-135M) to 2x (a Qwen2-1.5B shape) one token. Decoding and verification forwards have
exactly these shapes.

:class:`RoutedLinears` routes the CPU float32 / bfloat16 ``nn.Linear`` layers of a module
tree to :func:`specdec_kernels.ops.small_batch_linear` while it is active; the engine enables it
around its own CPU forwards. That kernel streams each weight row once for all rows and reduces
every output element in one fixed order, so a row's result is bit-identical whatever the number
of rows: with the tree-attention kernel, a verification forward over K tokens yields exactly
the logits that one-token decoding would. Prefill forwards need no batch invariance: from some
hundred rows on, torch's GEMM (oneDNN's, :func:`gemm_linear`) can be faster, and the routing
leaves linears of that many rows to it (``gemm_rows``, measured per machine by
:mod:`~specdec_kernels.decoding.kernel_choice`).

How: while active, each routed layer's ``weight`` entry holds a :class:`KernelWeight` (the same
storage, a tensor subclass whose ``__torch_function__`` sees the layer's ``F.linear``); on exit
the layer's own parameter is back. Only the linears pay a Python call. A ``TorchFunctionMode``
did the same job before and intercepted every torch call of the forward (2,319 a step on the
default model): 3.7 ms of a 21.1 ms step at file precision, 2.2 ms of 34.3 at float32
(``python3 -m bench.routing_overhead``, 2026-11-26).

Weights at a GGUF file's precision (:class:`~specdec_kernels.models.quantized_weight.QuantizedWeight`,
loaded by ``load_model(..., weights="file")``) reach
:func:`specdec_kernels.ops.quantized_linear` (batch-invariant as well, on any device) through
their own ``__torch_function__``: they need no routing here.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import QuantizedWeight

__all__ = [
    "GEMM_LIBRARY", "KernelWeight", "RoutedLinears", "gemm_linear", "kernel_linear", "supports",
    "takes_float_weight",
]

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


def takes_float_weight(weight: torch.Tensor, bias: torch.Tensor | None,
                       dtype: torch.dtype) -> bool:
    """Whether :func:`kernel_linear` runs :func:`~specdec_kernels.ops.small_batch_linear` on
    this float weight for CPU activations of ``dtype`` (rows permitting): :func:`supports`
    for one such row."""
    return supports(torch.empty(1, weight.shape[-1], dtype=dtype), weight, bias)


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  max_rows: int | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the package's kernels: a weight at a file's precision
    through :func:`~specdec_kernels.ops.quantized_linear`, a float one through
    :func:`~specdec_kernels.ops.small_batch_linear` where :func:`supports` says so (at most
    ``max_rows`` rows), else torch's linear."""
    if isinstance(weight, QuantizedWeight):
        return weight.linear(x, bias)
    weight = weight.dense if isinstance(weight, KernelWeight) else weight.detach()
    if supports(x, weight, bias, max_rows):
        return ops.small_batch_linear(x, weight, bias)
    return gemm_linear(x, weight, bias)


def gemm_linear(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by torch's fastest GEMM, for rows that need no batch
    invariance (prefill): oneDNN's (``mkldnn::_linear_pointwise``) for CPU float32 / bfloat16
    operands where this torch has it and no gradient is wanted, else ``F.linear``.

    Why not ``F.linear``: for float32 it calls MKL's sgemm, which on AMD CPUs takes its AVX2
    code. 659 x 576 x 1536 on a 2-core Zen 5 (2026-11-28): MKL 205 GFLOPS,
    :func:`~specdec_kernels.ops.small_batch_linear` 278-375, oneDNN 474-490 (the cores' FMA
    peak is 502)."""
    if _onednn_takes(x, weight, bias):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _onednn_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not (_ONEDNN and torch.backends.mkldnn.enabled):
        return False
    operands = (x, weight) if bias is None else (x, weight, bias)
    if any(t.device.type != "cpu" or t.dtype != x.dtype for t in operands) or x.dtype not in _DTYPES:
        return False
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1] or x.numel() == 0:
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in operands))


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
#: Which GEMM :func:`gemm_linear` runs in this process (for the machine cache's keys).
GEMM_LIBRARY = "onednn" if _ONEDNN else "torch"


_routing = threading.local()  # max_rows of the routing active on this thread (absent: none)


class KernelWeight(torch.Tensor):
    """A float linear weight seen through :class:`RoutedLinears`: ``F.linear`` on it runs
    :func:`~specdec_kernels.ops.small_batch_linear` while the routing is active on the calling
    thread (and the operands qualify, :func:`supports`), else torch's linear; anything else
    is the plain weight's."""

    @staticmethod
    def of(weight: torch.Tensor) -> "KernelWeight":
        view = torch.Tensor._make_subclass(KernelWeight, weight.detach(), False)
        view.dense = weight.detach()  # the plain weight: checks and kernels skip the subclass
        return view

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and isinstance(args[1], KernelWeight):
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            max_rows = getattr(_routing, "max_rows", False)
            if max_rows is False:
                return F.linear(x, weight.dense, bias)
            return kernel_linear(x, weight, bias, max_rows)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


class RoutedLinears:
    """The CPU float32 / bfloat16 ``nn.Linear`` layers of ``module``, routed to
    :func:`~specdec_kernels.ops.small_batch_linear` inside ``with routed(gemm_rows):``.

    The module is unchanged outside that block. Layers are found once; a layer whose weight was
    replaced since (``model.to(...)``, a new parameter) is seen through its new weight. Weights
    at a file's precision (:class:`QuantizedWeight`) are left alone: they route themselves.

    Parameters
    ----------
    module : torch.nn.Module
    """

    def __init__(self, module: torch.nn.Module):
        self._layers = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
        self._views: dict = {}  # id(layer) -> (weight, its data pointer, its KernelWeight)

    def __call__(self, gemm_rows: int | None = None):
        """A context in which the layers run the kernel; linears of at least ``gemm_rows`` rows
        (None: none) stay with torch's GEMM (only for forwards whose rows need not be
        batch-invariant: prefill)."""
        if gemm_rows is not None and gemm_rows < 2:
            raise ValueError(f"gemm_rows must be >= 2 or None, got {gemm_rows}")
        return _Routing(self, None if gemm_rows is None else gemm_rows - 1)

    def _swap_in(self) -> list:
        swapped = []
        for layer in self._layers:
            weight = layer._parameters.get("weight")
            if weight is None or isinstance(weight, (KernelWeight, QuantizedWeight)):
                continue
            known = self._views.get(id(layer))
            # The same Parameter may hold new data (``param.data = ...``, as ``module.to`` does):
            # the view of the old storage would be stale.
            if known is None or known[0] is not weight or known[1] != weight.data_ptr():
                if weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2:
                    continue
                known = (weight, weight.data_ptr(), KernelWeight.of(weight))
                self._views[id(layer)] = known
            layer._parameters["weight"] = known[2]
            swapped.append((layer, weight))
        return swapped


class _Routing:
    def __init__(self, routed: RoutedLinears, max_rows):
        self._routed, self._max_rows = routed, max_rows

    def __enter__(self):
        self._outer = getattr(_routing, "max_rows", False)
        self._swapped = self._routed._swap_in()
        _routing.max_rows = self._max_rows
        return self

    def __exit__(self, *exc):
        for layer, weight in self._swapped:
            layer._parameters["weight"] = weight
        _routing.max_rows = self._outer
        return False
