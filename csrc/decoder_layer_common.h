// Argument checks shared by the CPU (decoder_layer.cpp) and CUDA (cuda/decoder_layer.cu)
// launchers of the decoder-layer ops: messages name the argument and the shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <utility>

namespace specdec {

inline void check_activation_dtype(const at::Tensor& x, const char* op, const char* name) {
  const auto t = x.scalar_type();
  TORCH_CHECK_VALUE(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op, ": ", name,
                    " must be float32, bfloat16 or float16, got ", t);
}

inline void check_like(const at::Tensor& t, const at::Tensor& x, const char* op, const char* name,
                       const char* x_name) {
  TORCH_CHECK_VALUE(t.scalar_type() == x.scalar_type(), op, ": ", name, " must have ", x_name,
                    "'s dtype ", x.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == x.device(), op, ": ", name, " must be on ", x.device(),
                    ", got ", t.device());
}

// x [..., H] (H > 0) and weight [H] of x's dtype and device.
inline void check_norm_args(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) > 0, op, ": x must be [..., H] with H > 0, got ",
                    x.sizes());
  check_activation_dtype(x, op, "x");
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(-1), op,
                    ": weight must be [H] = [", x.size(-1), "] for x of shape ", x.sizes(),
                    ", got ", weight.sizes());
  check_like(weight, x, op, "weight", "x");
}

inline void check_add_rms_norm_args(const at::Tensor& x, const at::Tensor& residual,
                                    const at::Tensor& weight) {
  check_norm_args(x, weight, "add_rms_norm");
  TORCH_CHECK_VALUE(residual.sizes() == x.sizes(), "add_rms_norm: residual must have x's shape ",
                    x.sizes(), ", got ", residual.sizes());
  check_like(residual, x, "add_rms_norm", "residual", "x");
}

// x [B, T, H, D] with D even; cos and sin [B, T, D] or [1, T, D], x's dtype and device.
inline void check_rotary_embedding_args(const at::Tensor& x, const at::Tensor& cos,
                                        const at::Tensor& sin) {
  TORCH_CHECK_VALUE(x.dim() == 4 && x.size(3) % 2 == 0 && x.size(3) > 0,
                    "rotary_embedding: x must be [B, T, H, D] with D even, got ", x.sizes());
  check_activation_dtype(x, "rotary_embedding", "x");
  const int64_t B = x.size(0), T = x.size(1), D = x.size(3);
  for (const auto& [t, name] : {std::pair{cos, "cos"}, std::pair{sin, "sin"}}) {
    TORCH_CHECK_VALUE(t.dim() == 3 && (t.size(0) == B || t.size(0) == 1) && t.size(1) == T &&
                          t.size(2) == D,
                      "rotary_embedding: ", name, " must be [B, T, D] = [", B, ", ", T, ", ", D,
                      "] (or [1, T, D]) for x of shape ", x.sizes(), ", got ", t.sizes());
    check_like(t, x, "rotary_embedding", name, "x");
  }
}

inline void check_silu_mul_args(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK_VALUE(gate.dim() >= 1 && gate.size(-1) > 0,
                    "silu_mul: gate must be [..., I] with I > 0, got ", gate.sizes());
  check_activation_dtype(gate, "silu_mul", "gate");
  TORCH_CHECK_VALUE(up.sizes() == gate.sizes(), "silu_mul: up must have gate's shape ",
                    gate.sizes(), ", got ", up.sizes());
  check_like(up, gate, "silu_mul", "up", "gate");
}

}  // namespace specdec
