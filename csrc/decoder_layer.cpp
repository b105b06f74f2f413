// CPU kernels of the decoder-layer glue ops (schemas and semantics: registration.cpp): the
// RMSNorm, residual add + RMSNorm, rotary embedding and SiLU-gate between a layer's linears.
//
// At batch 1 these ops touch a few kilobytes each; what they cost as torch expressions was the
// dispatch of 5-14 ops apiece (bench/RESULTS.md, 2026-11-26 fourth session). Each op gives the
// bits of the torch expression it replaces, so the direct forward stays bit-identical to the
// model's own; the arithmetic and how it keeps torch's bits are in cpu_decoder_glue.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

#include "cpu_decoder_glue.h"
#include "decoder_layer_common.h"

namespace specdec {
namespace {

using glue::HeadStrides;

// Float32 scratch of the norms' row sums: squares [count, n] and sums [count].
std::pair<at::Tensor, at::Tensor> norm_scratch(int64_t count, int64_t n) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  return {at::empty({count, n}, f32), at::empty({count}, f32)};
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm_args(x, weight, "rms_norm");
  const at::Tensor rows = x.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty_like(rows);
  const int64_t n = rows.size(-1), count = rows.numel() / n;
  auto [squares, sums] = norm_scratch(count, n);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    glue::rms_norm_rows(rows.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                        out.mutable_data_ptr<scalar_t>(), count, n, eps, squares, sums);
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
  auto [squares, sums] = norm_scratch(count, n);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    glue::add_rms_norm_rows(a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(),
                            w.const_data_ptr<scalar_t>(), sum.mutable_data_ptr<scalar_t>(),
                            normed.mutable_data_ptr<scalar_t>(), count, n, eps, squares, sums);
  });
  return {sum, normed};
}

at::Tensor rotary_embedding_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_rotary_embedding_args(x, cos, sin);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const at::Tensor src = x.stride(3) == 1 ? x : x.contiguous();
  const at::Tensor c = cos.expand({B, T, D}).contiguous(), s = sin.expand({B, T, D}).contiguous();
  at::Tensor out = at::empty({B, T, H, D}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotary_embedding", [&] {
    glue::rotary_rows(src.const_data_ptr<scalar_t>(),
                      HeadStrides{src.stride(0), src.stride(1), src.stride(2)},
                      c.const_data_ptr<scalar_t>(), s.const_data_ptr<scalar_t>(),
                      out.mutable_data_ptr<scalar_t>(), HeadStrides{T * H * D, H * D, D}, B, T,
                      H, D);
  });
  return out;
}

at::Tensor silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  check_silu_mul_args(gate, up);
  const int64_t n = gate.size(-1);
  // A [rows, I] view of up where the layout allows (the halves of one joined projection do).
  const at::Tensor u = (up.stride(-1) == 1 ? up : up.contiguous()).reshape({-1, n});
  const at::Tensor g = gate.contiguous();
  at::Tensor act = at::empty_like(g);
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate.scalar_type(), "silu_mul", [&] {
    glue::silu_mul_rows(g, u.const_data_ptr<scalar_t>(), u.stride(0),
                        out.mutable_data_ptr<scalar_t>(), act, u.size(0), n);
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
