// CUDA path of small_batch_linear: torch's own linear. cuBLAS already keeps small batches near
// one row's cost on a GPU, so the CPU kernel's reason to exist (csrc/linear.cpp) does not apply;
// the op exists on CUDA so callers need no device branch.

#include <ATen/ops/linear.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "linear_common.h"

namespace specdec {
namespace {

at::Tensor small_batch_linear_cuda(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias) {
  check_small_batch_linear_args(x, weight, bias);
  const c10::cuda::CUDAGuard guard(x.device());
  return at::linear(x, weight, bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("small_batch_linear", &small_batch_linear_cuda); }

}  // namespace specdec
