// CUDA path of the decoder-layer glue ops (rms_norm, add_rms_norm, rotary_embedding,
// silu_mul): the reference's torch expressions. The CPU kernels exist to cut the per-op
// dispatch of a batch-1 CPU step (the direct forward runs only there); on a GPU this keeps
// the ops callable without a device branch. Same argument checks as the CPU kernels.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "decoder_layer_common.h"

namespace specdec {
namespace {

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor hidden = x.to(at::kFloat);
  const at::Tensor variance = hidden.pow(2).mean({-1}, /*keepdim=*/true);
  return (weight * (hidden * at::rsqrt(variance + eps)).to(x.scalar_type())).contiguous();
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_args(x, weight, "rms_norm");
  const c10::cuda::CUDAGuard guard(x.device());
  return norm(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x,
                                                     const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps) {
  check_add_rms_norm_args(x, residual, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor total = (x + residual).contiguous();
  return {total, norm(total, weight, eps)};
}

at::Tensor rotary_embedding_cuda(const at::Tensor& x, const at::Tensor& cos,
                                 const at::Tensor& sin) {
  check_rotary_embedding_args(x, cos, sin);
  const int64_t D = x.size(3);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t half = D / 2;
  const at::Tensor rotated = at::cat({-x.narrow(3, half, half), x.narrow(3, 0, half)}, 3);
  return (x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)).contiguous();
}

at::Tensor silu_mul_cuda(const at::Tensor& gate, const at::Tensor& up) {
  check_silu_mul_args(gate, up);
  const c10::cuda::CUDAGuard guard(gate.device());
  return (at::silu(gate) * up).contiguous();
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("add_rms_norm", &add_rms_norm_cuda);
  m.impl("rotary_embedding", &rotary_embedding_cuda);
  m.impl("silu_mul", &silu_mul_cuda);
}

}  // namespace specdec
