// Argument checks shared by the CPU (linear.cpp) and CUDA (cuda/linear.cu) launchers of
// small_batch_linear: messages name the argument and the shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

namespace specdec {

// x [..., K], weight [N, K] and bias [N] of x's dtype and device. Returns N.
inline int64_t check_small_batch_linear_args(const at::Tensor& x, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "small_batch_linear: x must have shape [..., K], got ", x.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 2, "small_batch_linear: weight must have shape [N, K], got ",
                    weight.sizes());
  const int64_t N = weight.size(0);
  TORCH_CHECK_VALUE(x.size(-1) == weight.size(1), "small_batch_linear: x has shape ", x.sizes(),
                    " but weight has shape ", weight.sizes(), " (the last dims must match)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(weight.scalar_type() == dtype, "small_batch_linear: weight has dtype ",
                    weight.scalar_type(), " but x has ", dtype, " (they must match)");
  TORCH_CHECK_VALUE(weight.device() == x.device(), "small_batch_linear: weight is on ",
                    weight.device(), " but x is on ", x.device());
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N,
                      "small_batch_linear: bias must have shape [", N, "], got ", bias->sizes());
    TORCH_CHECK_VALUE(bias->scalar_type() == dtype, "small_batch_linear: bias has dtype ",
                      bias->scalar_type(), " but x has ", dtype);
    TORCH_CHECK_VALUE(bias->device() == x.device(), "small_batch_linear: bias is on ",
                      bias->device(), " but x is on ", x.device());
  }
  return N;
}

}  // namespace specdec
