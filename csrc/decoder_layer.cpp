// CPU kernels of the decoder-layer glue ops (schemas and semantics: registration.cpp): the
// RMSNorm, residual add + RMSNorm, rotary embedding and SiLU-gate between a layer's linears.
//
// At batch 1 these ops touch a few kilobytes each; what they cost as torch expressions was the
// dispatch of 5-14 ops apiece (bench/RESULTS.md, 2026-11-26 fourth session). Each op gives the
// bits of the torch expression it replaces, so the direct forward stays bit-identical to the
// model's own: the element-wise arithmetic is done here in torch's order and roundings
// (sub-float dtypes widened to float and rounded back, to nearest even, wherever torch rounds;
// this file is built with -ffp-contract=off), and the two steps whose bits depend on torch's
// vector code (the row sums of squares of the norms' mean, and SiLU's exp) call torch itself,
// on tensors of the layout the modules give them. Every row is computed on its own
// (batch-invariant, as torch's own row reductions are).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

#include "decoder_layer_common.h"

namespace specdec {
namespace {

// Row counts below this many elements stay on the calling thread (a decoding step's rows).
constexpr int64_t kParallelElements = 1 << 15;

int64_t row_grain(int64_t row_length) {
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

// The sums of x^2 over each row of [count, n] in float32, by torch's own sum (the squares
// computed here, exactly as torch's pow(x, 2)): the reduction of the RMSNorm expression's
// mean (torch's mean is this sum divided by n), hence its bits. One aten call instead of six.
template <typename T>
at::Tensor sums_of_squares(const T* x, int64_t count, int64_t n) {
  at::Tensor squares = at::empty({count, n}, at::TensorOptions().dtype(at::kFloat));
  float* sq = squares.mutable_data_ptr<float>();
  for (int64_t i = 0; i < count * n; ++i) {
    const float v = widen(x[i]);
    sq[i] = v * v;
  }
  return at::sum(squares, {-1}).contiguous();
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

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_args(x, weight, "rms_norm");
  const at::Tensor rows = x.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty_like(rows);
  const int64_t n = rows.size(-1), count = rows.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* src = rows.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    const at::Tensor sum_sq = sums_of_squares(src, count, n);
    const float* var = sum_sq.const_data_ptr<float>();
    at::parallel_for(0, count, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        norm_row(src + r * n, wp, dst + r * n, n, var[r], static_cast<float>(eps));
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x,
                                                    const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  check_add_rms_norm_args(x, residual, weight);
  const at::Tensor a = x.contiguous(), b = residual.contiguous(), w = weight.contiguous();
  at::Tensor sum = at::empty_like(a), normed = at::empty_like(a);
  const int64_t n = a.size(-1), count = a.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* pa = a.const_data_ptr<scalar_t>();
    const scalar_t* pb = b.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    scalar_t* ps = sum.mutable_data_ptr<scalar_t>();
    scalar_t* pn = normed.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < count * n; ++i) ps[i] = round_to<scalar_t>(widen(pa[i]) + widen(pb[i]));
    const at::Tensor sum_sq = sums_of_squares(ps, count, n);
    const float* var = sum_sq.const_data_ptr<float>();
    at::parallel_for(0, count, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        norm_row(ps + r * n, wp, pn + r * n, n, var[r], static_cast<float>(eps));
    });
  });
  return {sum, normed};
}

at::Tensor rotary_embedding_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_rotary_embedding_args(x, cos, sin);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const at::Tensor src = x.stride(3) == 1 ? x : x.contiguous();
  const at::Tensor c = cos.expand({B, T, D}).contiguous(), s = sin.expand({B, T, D}).contiguous();
  at::Tensor out = at::empty({B, T, H, D}, x.options());
  const int64_t half = D / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary_embedding", [&] {
    const scalar_t* px = src.const_data_ptr<scalar_t>();
    const scalar_t* pc = c.const_data_ptr<scalar_t>();
    const scalar_t* ps = s.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    const int64_t sb = src.stride(0), st = src.stride(1), sh = src.stride(2);
    at::parallel_for(0, B * T * H, row_grain(D), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / (T * H), t = (r / H) % T, h = r % H;
        const scalar_t* xr = px + b * sb + t * st + h * sh;
        const scalar_t* cr = pc + (b * T + t) * D;
        const scalar_t* sr = ps + (b * T + t) * D;
        scalar_t* o = po + r * D;
        // x * cos + cat(-x2, x1) * sin: each product rounded to the dtype, then the sum.
        for (int64_t i = 0; i < half; ++i) {
          const scalar_t a = round_to<scalar_t>(widen(xr[i]) * widen(cr[i]));
          const scalar_t r2 = round_to<scalar_t>(-widen(xr[i + half]) * widen(sr[i]));
          o[i] = round_to<scalar_t>(widen(a) + widen(r2));
        }
        for (int64_t i = half; i < D; ++i) {
          const scalar_t a = round_to<scalar_t>(widen(xr[i]) * widen(cr[i]));
          const scalar_t r2 = round_to<scalar_t>(widen(xr[i - half]) * widen(sr[i]));
          o[i] = round_to<scalar_t>(widen(a) + widen(r2));
        }
      }
    });
  });
  return out;
}

at::Tensor silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  check_silu_mul_args(gate, up);
  const int64_t n = gate.size(-1);
  // [rows, I] views where the layout allows (the halves of one joined projection do).
  const at::Tensor g = (gate.stride(-1) == 1 ? gate : gate.contiguous()).reshape({-1, n});
  const at::Tensor u = (up.stride(-1) == 1 ? up : up.contiguous()).reshape({-1, n});
  const int64_t count = g.size(0);
  // torch's own SiLU on a contiguous copy of gate (the layout of the module's own gate_proj
  // output: the same vectorised and tail elements, hence the same bits), then the product.
  const at::Tensor act = at::silu(gate.contiguous()).reshape({-1, n});
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate.scalar_type(), "silu_mul", [&] {
    const scalar_t* pa = act.const_data_ptr<scalar_t>();
    const scalar_t* pu = u.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    const int64_t su = u.stride(0);
    at::parallel_for(0, count, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t i = 0; i < n; ++i)
          po[r * n + i] = round_to<scalar_t>(widen(pa[r * n + i]) * widen(pu[r * su + i]));
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("add_rms_norm", &add_rms_norm_cpu);
  m.impl("rotary_embedding", &rotary_embedding_cpu);
  m.impl("silu_mul", &silu_mul_cpu);
}

}  // namespace specdec
