"""What this installation was built with, answered from the dispatcher where possible."""

from __future__ import annotations

import torch

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
    """
    from specdec_kernels import _build_config as config

    return {
        "cpu": _has_kernel("CPU"),
        "cuda": has_cuda_kernels(),
        "cuda_arch_list": config.CUDA_ARCH_LIST,
        "torch_built": config.TORCH_VERSION,
        "torch_runtime": torch.__version__,
        "cuda_built": config.CUDA_VERSION,
        "cuda_available": torch.cuda.is_available(),
    }
