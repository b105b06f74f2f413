// The arithmetic of the decoder-layer glue ops on CPU (decoder_layer.cpp), on raw rows: the ops
// call it on their tensors, and decoder_stack_'s one-call path (decoder_stack.cpp) on buffers it
// reuses from layer to layer, so both give the same bits. Element-wise steps are done in
// torch's order and roundings (sub-float dtypes widened to float and rounded back to nearest
// even wherever torch rounds; built with -ffp-contract=off); the two steps whose bits depend on
// torch's vector code (the norms' row sums of squares, SiLU's exp) call torch itself on tensors
// of the layout the modules give them. Every row is computed on its own (batch-invariant).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace specdec {
namespace glue {

// Row counts below this many elements stay on the calling thread (a decoding step's rows).
constexpr int64_t kParallelElements = 1 << 15;

inline int64_t row_grain(int64_t row_length) {
  return std::max<int64_t>(1, kParallelElements / std::max<int64_t>(1, row_length));
}

template <typename T>
inline float widen(T v) {
  return static_cast<float>(v);
}

// float -> T rounded to nearest even (the identity for float).
template <typename T>
inline T round_to(float v) {
  return static_cast<T>(v);
}

// sums [count] (float32) = the sums of x^2 over each row of x [count, n] by torch's own sum
// (the squares computed here into `squares` [count, n] float32, exactly as torch's pow(x, 2)):
// the reduction of the RMSNorm expression's mean (torch's mean is this sum divided by n), hence
// its bits. One aten call instead of six.
template <typename T>
void sums_of_squares(const T* x, int64_t count, int64_t n, at::Tensor& squares, at::Tensor& sums) {
  float* sq = squares.mutable_data_ptr<float>();
  for (int64_t i = 0; i < count * n; ++i) {
    const float v = widen(x[i]);
    sq[i] = v * v;
  }
  at::sum_out(sums, squares, {-1});
}

// out = weight * to_T(x * rsqrt(sum_sq / n + eps)), as the Llama-family RMSNorm computes it.
template <typename T>
void norm_row(const T* x, const T* weight, T* out, int64_t n, float sum_sq, float eps) {
  const float variance = sum_sq / static_cast<float>(n);
  const float inverse = 1.f / std::sqrt(variance + eps);
  for (int64_t i = 0; i < n; ++i) {
    const T normed = round_to<T>(widen(x[i]) * inverse);
    out[i] = round_to<T>(widen(weight[i]) * widen(normed));
  }
}

// out [count, n] = RMSNorm of x [count, n] with weight [n]; squares [count, n] and sums [count]
// float32 scratch.
template <typename T>
void rms_norm_rows(const T* x, const T* weight, T* out, int64_t count, int64_t n, double eps,
                   at::Tensor& squares, at::Tensor& sums) {
  sums_of_squares(x, count, n, squares, sums);
  const float* var = sums.const_data_ptr<float>();
  at::parallel_for(0, count, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      norm_row(x + r * n, weight, out + r * n, n, var[r], static_cast<float>(eps));
  });
}

// sum = to_T(x + residual) and normed = its RMSNorm, rows of n; sum may be residual itself.
template <typename T>
void add_rms_norm_rows(const T* x, const T* residual, const T* weight, T* sum, T* normed,
                       int64_t count, int64_t n, double eps, at::Tensor& squares,
                       at::Tensor& sums) {
  for (int64_t i = 0; i < count * n; ++i) sum[i] = round_to<T>(widen(x[i]) + widen(residual[i]));
  rms_norm_rows(sum, weight, normed, count, n, eps, squares, sums);
}

// Element strides of a [B, T, H, D] operand (D contiguous).
struct HeadStrides {
  int64_t b, t, h;
};

// out = x * cos + cat(-x2, x1) * sin over H heads of D for B x T rows; cos and sin are [B, T, D]
// contiguous. Each product rounded to the dtype, then the sum.
template <typename T>
void rotary_rows(const T* x, HeadStrides xs, const T* cos, const T* sin, T* out, HeadStrides os,
                 int64_t B, int64_t T_, int64_t H, int64_t D) {
  const int64_t half = D / 2;
  at::parallel_for(0, B * T_ * H, row_grain(D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (T_ * H), t = (r / H) % T_, h = r % H;
      const T* xr = x + b * xs.b + t * xs.t + h * xs.h;
      const T* cr = cos + (b * T_ + t) * D;
      const T* sr = sin + (b * T_ + t) * D;
      T* o = out + b * os.b + t * os.t + h * os.h;
      for (int64_t i = 0; i < half; ++i) {
        const T a = round_to<T>(widen(xr[i]) * widen(cr[i]));
        const T r2 = round_to<T>(-widen(xr[i + half]) * widen(sr[i]));
        o[i] = round_to<T>(widen(a) + widen(r2));
      }
      for (int64_t i = half; i < D; ++i) {
        const T a = round_to<T>(widen(xr[i]) * widen(cr[i]));
        const T r2 = round_to<T>(widen(xr[i - half]) * widen(sr[i]));
        o[i] = round_to<T>(widen(a) + widen(r2));
      }
    }
  });
}

// out [count, n] = SiLU(gate) * up: torch's own SiLU of gate (contiguous, the layout of the
// module's own gate_proj output: the same vectorised and tail elements, hence the same bits)
// into act (gate's shape), then the product with up's rows (su apart).
template <typename T>
void silu_mul_rows(const at::Tensor& gate, const T* up, int64_t su, T* out, at::Tensor& act,
                   int64_t count, int64_t n) {
  at::silu_out(act, gate);
  const T* pa = act.const_data_ptr<T>();
  at::parallel_for(0, count, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < n; ++i)
        out[r * n + i] = round_to<T>(widen(pa[r * n + i]) * widen(up[r * su + i]));
  });
}

}  // namespace glue
}  // namespace specdec
