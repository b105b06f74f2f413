"""What the compiled library is: the backends this build registered (answered from the
dispatcher where possible) and the instruction set its CPU kernels run (``cpu_isa`` in
``csrc/linear.cpp``, read by every CPU kernel).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["build_info", "cpu_isa", "has_cuda_kernels"]

_PROBE_OP = "specdec::compact_kv_cache_"


def _has_kernel(dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(_PROBE_OP, dispatch_key)


def has_cuda_kernels() -> bool:
    """Whether CUDA kernels of the specdec ops are registered with the dispatcher."""
    return _has_kernel("CUDA")


def build_info() -> dict:
    """Backends and versions of this build.

    Returns
    -------
    dict
        ``cpu`` / ``cuda``: whether kernels for that backend are registered (from the
        dispatcher); ``cuda_arch_list``: the architectures compiled for (empty without CUDA);
        ``torch_built`` / ``torch_runtime``: torch version at build time and now;
        ``cuda_built``: the CUDA version compiled against (None without CUDA);
        ``cuda_available``: whether torch sees a GPU now.

    Examples
    --------
    >>> import specdec_kernels
    >>> specdec_kernels.build_info()["cpu"]
    True
    """
    from specdec_kernels._build_config import CUDA_ARCH_LIST, CUDA_VERSION, TORCH_VERSION

    return {
        "cpu": _has_kernel("CPU"),
        "cuda": has_cuda_kernels(),
        "cuda_arch_list": CUDA_ARCH_LIST,
        "torch_built": TORCH_VERSION,
        "torch_runtime": torch.__version__,
        "cuda_built": CUDA_VERSION,
        "cuda_available": torch.cuda.is_available(),
    }


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

    Examples
    --------
    >>> from specdec_kernels import ops
    >>> ops.cpu_isa() in ("avx512_bf16", "avx512", "avx2", "portable")
    True
    """
    if cap is None:
        return torch.ops.specdec.cpu_isa(-2)
    levels = {"none": -1, "portable": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3}
    if cap not in levels:
        raise ValueError(f"cap must be one of {sorted(levels)}, got {cap!r}")
    return torch.ops.specdec.cpu_isa(levels[cap])
