"""FlashInfer-compatible sampling (``flashinfer.sampling``) on this package's CPU and CUDA ops.

Switch with one line: ``import specdec_kernels.compat.flashinfer as flashinfer``; then
``flashinfer.sampling.chain_speculative_sampling(...)`` (or
``flashinfer.chain_speculative_sampling``) behaves as FlashInfer documents it. Differences are listed in :mod:`.sampling`.
"""

from specdec_kernels.compat.flashinfer import sampling
from specdec_kernels.compat.flashinfer.sampling import *  # noqa: F401,F403
from specdec_kernels.compat.flashinfer.sampling import __all__ as _sampling_all

__all__ = ["sampling", *_sampling_all]
