"""specdec_kernels: speculative-decoding kernels for PyTorch.

Importing the package loads the compiled operators into ``torch.ops.specdec`` (CPU kernels
always, CUDA kernels when the extension was built with them) and their fake kernels, so the
ops work under ``torch.compile``. Typed wrappers live in :mod:`specdec_kernels.ops`, the
executable specification of every op in :mod:`specdec_kernels.reference`.
"""

import torch  # noqa: F401  (loads libtorch, which _C links against)

from specdec_kernels import _C  # noqa: F401  (registers torch.ops.specdec.*)
from specdec_kernels import ops
from specdec_kernels.ops.build import build_info, has_cuda_kernels

__all__ = ["build_info", "compat", "generate", "has_cuda_kernels", "hf", "ops"]


def __getattr__(name):
    # The decoding layer needs transformers: imported on first use only.
    if name == "generate":
        from specdec_kernels.decoding import generate

        return generate
    if name in ("compat", "hf"):  # peer adapters and transformers' custom_generate
        import importlib

        return importlib.import_module(f"specdec_kernels.{name}")
    raise AttributeError(f"module 'specdec_kernels' has no attribute {name!r}")


__version__ = "0.1.0"
