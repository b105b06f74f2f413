"""Drop-in adapters with the signatures and semantics of other engines' kernels, on this
package's CPU and CUDA ops (thin Python: every adapter is one or two op launches plus tensor
reshaping). Switch an engine by changing one import:

- :mod:`specdec_kernels.compat.flashinfer`: ``flashinfer.sampling`` (chain speculative
  sampling, sampling from probabilities or logits with top-k / top-p / min-p, renormalisation).
- :mod:`specdec_kernels.compat.sgl_kernel`: sgl-kernel's EAGLE tree verification
  (``verify_tree_greedy``, ``tree_speculative_sampling_target_only``) and tree builder
  (``build_tree_kernel_efficient``).
- :mod:`specdec_kernels.compat.vllm`: vLLM v1's rejection sampler (``rejection_sample``,
  ``RejectionSampler``).

Each module's docstring lists where it differs from its peer.
"""

from specdec_kernels.compat import flashinfer, sgl_kernel, vllm

__all__ = ["flashinfer", "sgl_kernel", "vllm"]
