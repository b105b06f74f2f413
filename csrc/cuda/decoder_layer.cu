// CUDA path of the decoder-layer glue ops (rms_norm, add_rms_norm, rotary_embedding,
// silu_mul): the reference's torch expressions. The CPU kernels exist to cut the per-op
// dispatch of a batch-1 CPU step (the direct forward runs only there); on a GPU this keeps
// the ops callable without a device branch. Same argument checks as the CPU kernels.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

namespace specdec {
namespace {

void check_float(const at::Tensor& x, const char* op, const char* name) {
  const auto t = x.scalar_type();
  TORCH_CHECK_VALUE(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op, ": ", name,
                    " must be float32, bfloat16 or float16, got ", t);
}

void check_like(const at::Tensor& t, const at::Tensor& x, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.scalar_type() == x.scalar_type() && t.device() == x.device(), op, ": ",
                    name, " must have x's dtype ", x.scalar_type(), " and device ", x.device(),
                    ", got ", t.scalar_type(), " on ", t.device());
}

void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) > 0, op, ": x must be [..., H] with H > 0, got ",
                    x.sizes());
  check_float(x, op, "x");
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(-1), op,
                    ": weight must be [H] = [", x.size(-1), "] for x of shape ", x.sizes(),
                    ", got ", weight.sizes());
  check_like(weight, x, op, "weight");
}

at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor hidden = x.to(at::kFloat);
  const at::Tensor variance = hidden.pow(2).mean({-1}, /*keepdim=*/true);
  return (weight * (hidden * at::rsqrt(variance + eps)).to(x.scalar_type())).contiguous();
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight, "rms_norm");
  const c10::cuda::CUDAGuard guard(x.device());
  return norm(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x,
                                                     const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps) {
  check_norm(x, weight, "add_rms_norm");
  TORCH_CHECK_VALUE(residual.sizes() == x.sizes(), "add_rms_norm: residual must have x's shape ",
                    x.sizes(), ", got ", residual.sizes());
  check_like(residual, x, "add_rms_norm", "residual");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor total = (x + residual).contiguous();
  return {total, norm(total, weight, eps)};
}

at::Tensor rotary_embedding_cuda(const at::Tensor& x, const at::Tensor& cos,
                                 const at::Tensor& sin) {
  TORCH_CHECK_VALUE(x.dim() == 4 && x.size(3) % 2 == 0 && x.size(3) > 0,
                    "rotary_embedding: x must be [B, T, H, D] with D even, got ", x.sizes());
  check_float(x, "rotary_embedding", "x");
  const int64_t B = x.size(0), T = x.size(1), D = x.size(3);
  for (const auto& [t, name] : {std::pair{cos, "cos"}, std::pair{sin, "sin"}}) {
    TORCH_CHECK_VALUE(t.dim() == 3 && (t.size(0) == B || t.size(0) == 1) && t.size(1) == T &&
                          t.size(2) == D,
                      "rotary_embedding: ", name, " must be [B, T, D] = [", B, ", ", T, ", ", D,
                      "] (or [1, T, D]) for x of shape ", x.sizes(), ", got ", t.sizes());
    check_like(t, x, "rotary_embedding", name);
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t half = D / 2;
  const at::Tensor rotated = at::cat({-x.narrow(3, half, half), x.narrow(3, 0, half)}, 3);
  return (x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)).contiguous();
}

at::Tensor silu_mul_cuda(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK_VALUE(gate.dim() >= 1 && gate.size(-1) > 0,
                    "silu_mul: gate must be [..., I] with I > 0, got ", gate.sizes());
  check_float(gate, "silu_mul", "gate");
  TORCH_CHECK_VALUE(up.sizes() == gate.sizes(), "silu_mul: up must have gate's shape ",
                    gate.sizes(), ", got ", up.sizes());
  check_like(up, gate, "silu_mul", "up");
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
