// CPU kernel of quantized_linear: out[m, n] = x[m, :] . W[n, :] (+ bias[n]) with W held at a
// GGUF file's precision (int8 or int4 values in groups along K with per-group scales and
// optional mins; layouts in cpu_qdot.h) for the few rows of a decoding or verification
// forward.
//
// Why integer dot products: x is quantized per row to int8 (blocks of 32, one float scale
// each) and multiplied with vpdpbusd (AVX-512 VNNI) or vpmaddubsw (AVX2), 4 products per lane
// and instruction. Measured on the 2-core Zen 4 (bench/RESULTS.md, 2026-03 issue-23 entry):
// dequantizing int4 weights to float and using FMAs costs about 3x the instructions per
// weight, which made one row compute-bound at ~2x the time the weight bytes take to stream;
// the integer path stays at the bandwidth at M = 1 and costs less per extra row. Quantizing a
// row depends on that row only, so the result is still batch-invariant (cpu_qdot.h).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "cpu_panel_linear.h"
#include "cpu_qdot.h"
#include "cpu_qpanel.h"

namespace specdec {
namespace {

using qdot::QuantizedRows;
using qdot::QuantizedWeights;

template <typename S>
void qlinear_rows(const QuantizedRows& x, const QuantizedWeights<S>& w, int64_t N, float* out,
                  const qdot::QTileTable<S>& tiles) {
  const int64_t M = x.rows;
  const int weight_tile = M == 1 ? qdot::kSingleRowWeightTile : qdot::kWeightTile;
  const int64_t num_tiles = (N + weight_tile - 1) / weight_tile;
  // Enough weight bytes per task to amortise the scheduling (~64 KB).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, weight_tile * w.row_bytes));
  at::parallel_for(0, num_tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t n0 = tile * weight_tile;
      const int nr = static_cast<int>(std::min<int64_t>(weight_tile, N - n0));
      if (M == 1) {
        tiles.single[nr - 1](x, 0, w, n0, out + n0, N);
        continue;
      }
      // The weight tile stays in cache while every row tile passes over it.
      for (int64_t m0 = 0; m0 < M; m0 += qdot::kMaxRowTile) {
        const int mr = static_cast<int>(std::min<int64_t>(qdot::kMaxRowTile, M - m0));
        tiles.table[mr - 1][nr - 1](x, m0, w, n0, out + m0 * N + n0, N);
      }
    }
  });
}

// Row tiles as even as possible over M rows of panel p (the panel stays in cache while each
// passes over it).
template <typename S>
void panel_row_tiles(const qpanel::PanelRows& x, const qpanel::PanelWeights<S>& w, int64_t p,
                     int64_t N, float* out, const qpanel::PanelTiles<S>& tiles) {
  const int64_t M = x.rows, row_tiles = (M + tiles.rows - 1) / tiles.rows;
  int64_t m0 = 0;
  for (int64_t r = 0; r < row_tiles; ++r) {
    const int mr = static_cast<int>(M / row_tiles + (r < M % row_tiles ? 1 : 0));
    tiles.table[mr - 1](x, m0, w, p, out + m0 * N + p * qpanel::kPanelRows, N);
    m0 += mr;
  }
}

// K-quant scales under many row tiles (a prefill): each panel's scales and mins expanded once
// to float32, the float tiles run over them (the same values, so the same bits), instead of
// every row tile multiplying them out again (5-6% of a 700-row prefill).
template <int kEntries>
void expand_panel_scales(const qpanel::KScale* panel, int64_t blocks, bool negate, float* out) {
  for (int64_t b = 0; b < blocks; ++b)
    for (int i = 0; i < kEntries; ++i)
      out[b * kEntries + i] = negate ? qpanel::scale_at<kEntries, true>(panel, b, i)
                                     : qpanel::scale_at<kEntries, false>(panel, b, i);
}

template <typename S>
void qlinear_panels(const qpanel::PanelRows& x, const qpanel::PanelWeights<S>& w, int64_t panels,
                    int64_t panel_bytes, float* out, const qpanel::PanelTiles<S>& tiles,
                    const qpanel::PanelTiles<float>* expanded_tiles = nullptr, int entries = 16) {
  const int64_t N = panels * qpanel::kPanelRows;
  // Enough weight bytes per task to amortise the scheduling (~64 KB).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, panel_bytes));
  const bool expand = expanded_tiles != nullptr && x.rows > 2 * tiles.rows;
  at::parallel_for(0, panels, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scales, mins;
    for (int64_t p = begin; p < end; ++p) {
      if constexpr (std::is_same_v<S, qpanel::KScale>) {
        if (expand) {
          scales.resize(w.blocks * entries);
          const qpanel::KScale* ws = w.scale + p * w.blocks * qpanel::scale_stride<S>(entries);
          if (entries == 16) {
            expand_panel_scales<16>(ws, w.blocks, false, scales.data());
          } else {
            expand_panel_scales<32>(ws, w.blocks, false, scales.data());
          }
          if (w.min != nullptr) {
            mins.resize(w.blocks * 16);
            expand_panel_scales<16>(w.min + p * w.blocks * qpanel::scale_stride<S>(16), w.blocks, true,
                                    mins.data());
          }
          const qpanel::PanelWeights<float> one{w.q + p * panel_bytes, scales.data(),
                                                w.min != nullptr ? mins.data() : nullptr, w.blocks};
          // Panel 0 of `one` is panel p; its outputs are columns 16 p ...
          panel_row_tiles(x, one, 0, N, out + p * qpanel::kPanelRows, *expanded_tiles);
          continue;
        }
      }
      panel_row_tiles(x, w, p, N, out, tiles);
    }
  });
}

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// One call's operands, contiguous: x as M rows of K, the weight's parts.
struct Operands {
  int64_t M, K;
  at::Tensor rows, q, s, mn;
  int level;
};

// Scales of float32 or float16 (or int8: K-quant panel scales), mins like them: both layouts'
// weights are checked so (the panel one by panel_linear) before their tiles run.
void check_scales_and_mins(const at::Tensor& scales, const std::optional<at::Tensor>& mins) {
  const auto scale_type = scales.scalar_type();
  TORCH_CHECK_VALUE(scale_type == at::kFloat || scale_type == at::kHalf || scale_type == at::kChar,
                    "quantized_linear: scales must be float32 or float16 (or int8: K-quant panel "
                    "scales), got ", scale_type);
  if (mins.has_value()) {
    TORCH_CHECK_VALUE(mins->sizes() == scales.sizes(), "quantized_linear: mins has shape ",
                      mins->sizes(), " but scales has ", scales.sizes(), " (they must match)");
    TORCH_CHECK_VALUE(mins->scalar_type() == scale_type, "quantized_linear: mins has dtype ",
                      mins->scalar_type(), " but scales has ", scale_type);
  }
}

// What both layouts share around their tiles (scales and mins already checked,
// check_scales_and_mins): a bias of N in x's dtype; the operands made contiguous; the float32
// result plus the bias, in x's dtype and leading shape. `tiles(scale_tag, operands, out)` fills out [M, N].
template <typename Tiles>
at::Tensor linear_with(const at::Tensor& x, const at::Tensor& scales, const std::optional<at::Tensor>& mins,
                       const std::optional<at::Tensor>& bias, const at::Tensor& qweight, int64_t N,
                       Tiles&& tiles) {
  const auto dtype = x.scalar_type();
  const auto scale_type = scales.scalar_type();
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N,
                      "quantized_linear: bias must have shape [", N, "], got ", bias->sizes());
    TORCH_CHECK_VALUE(bias->scalar_type() == dtype, "quantized_linear: bias has dtype ",
                      bias->scalar_type(), " but x has ", dtype);
  }
  const int64_t K = x.size(-1);
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = N;
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  if (M == 0 || N == 0) return at::empty(out_sizes, x.options());

  // A contiguous x of any leading shape is its M rows of K, and the float32 result is made in
  // the output's shape: no reshape, view or same-dtype `to` to dispatch.
  const Operands op{M, K, x.contiguous(), qweight.contiguous(), scales.contiguous(),
                    mins.has_value() ? mins->contiguous() : at::Tensor(), simd::max_level()};
  at::Tensor out = at::empty(out_sizes, x.options().dtype(at::kFloat));
  if (scale_type == at::kFloat) {
    tiles(float{}, op, out.mutable_data_ptr<float>());
  } else if (scale_type == at::kHalf) {
    tiles(c10::Half{}, op, out.mutable_data_ptr<float>());
  } else {
    tiles(qpanel::KScale{}, op, out.mutable_data_ptr<float>());
  }
  if (bias.has_value()) out.add_(bias->to(at::kFloat));  // elementwise: the same for every row
  return dtype == at::kFloat ? out : out.to(dtype);
}

// Blocks of x quantized per task: one decoding row (18-48 blocks) stays on the calling thread.
constexpr int64_t kQuantizeGrain = 128;

// x's rows (float32 or bfloat16) quantized by `quantize(pointer)`.
template <typename Quantize>
auto quantized_rows(const Operands& op, Quantize&& quantize) {
  return op.rows.scalar_type() == at::kFloat ? quantize(op.rows.const_data_ptr<float>())
                                             : quantize(op.rows.const_data_ptr<c10::BFloat16>());
}

// A weight's panel tiles for its kind and scales' type, run over x's quantized rows.
template <typename S>
void run_panels(const PanelLinear& w, const qpanel::PanelRows& xq, float* out, int level) {
  const qpanel::PanelWeights<S> pw{static_cast<const uint8_t*>(w.qweight.const_data_ptr()),
                                   static_cast<const S*>(w.scales.const_data_ptr()),
                                   w.mins.defined() ? static_cast<const S*>(w.mins.const_data_ptr()) : nullptr,
                                   w.blocks};
  const auto& tiles = w.int4     ? qpanel::tiles_for<S, true>(level)
                      : w.halves ? qpanel::tiles_for<S, false, true>(level)
                                 : qpanel::tiles_for<S, false>(level);
  const auto& float_tiles = w.int4     ? qpanel::tiles_for<float, true>(level)
                            : w.halves ? qpanel::tiles_for<float, false, true>(level)
                                       : qpanel::tiles_for<float, false>(level);
  qlinear_panels(xq, pw, w.panels, w.blocks * qpanel::block_bytes(w.int4), out, tiles,
                 w.kquant ? &float_tiles : nullptr, static_cast<int>(w.entries));
}

template <typename T>
void run_panel_rows(const PanelLinear& w, const T* x, int64_t M, float* out, qpanel::PanelRows& xq) {
  const int level = simd::max_level();
  qpanel::resize_rows(xq, M, w.K);
  // The rows' blocks are quantized on every thread: at 16 rows they cost ~10% of the call.
  at::parallel_for(0, M * w.blocks, kQuantizeGrain, [&](int64_t begin, int64_t end) {
    qpanel::quantize_blocks(x, xq, begin, end, level);
  });
  switch (w.scales.scalar_type()) {
    case at::kFloat: return run_panels<float>(w, xq, out, level);
    case at::kHalf: return run_panels<c10::Half>(w, xq, out, level);
    default: return run_panels<qpanel::KScale>(w, xq, out, level);
  }
}

// The panel layout (cpu_qpanel.h): int4 or int8, group 32 (int8 also 16), 16 weight rows per
// panel.
at::Tensor quantized_linear_panels_cpu(const at::Tensor& x, const at::Tensor& qweight,
                                       const at::Tensor& scales, const std::optional<at::Tensor>& mins,
                                       const std::optional<at::Tensor>& bias) {
  const PanelLinear w = panel_linear(qweight, scales, mins, x.size(-1));
  return linear_with(x, scales, mins, bias, qweight, w.N,
                     [&](auto, const Operands& op, float* out) {
    qpanel::PanelRows xq;
    quantized_rows(op, [&](auto rows) { run_panel_rows(w, rows, op.M, out, xq); });
  });
}

at::Tensor quantized_linear_cpu(const at::Tensor& x, const at::Tensor& qweight,
                                const at::Tensor& scales, const std::optional<at::Tensor>& mins,
                                const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "quantized_linear: x must have shape [..., K], got ", x.sizes());
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16,
                    "quantized_linear: x must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK_VALUE(qweight.dim() == 2 || qweight.dim() == 3, "quantized_linear: qweight must have shape [N, K] (int8), "
                    "[N, K / 2] (uint8, packed int4) or [N / 16, K / 32, 256 or 512] (panels of int4 or int8), got ",
                    qweight.sizes());
  for (const at::Tensor* t : {&qweight, &scales}) {
    TORCH_CHECK_VALUE(t->device() == x.device(), "quantized_linear: x is on ", x.device(),
                      " but a weight tensor is on ", t->device());
  }
  TORCH_CHECK_VALUE(!mins.has_value() || mins->device() == x.device(),
                    "quantized_linear: mins is on ", mins->device(), " but x is on ", x.device());
  TORCH_CHECK_VALUE(!bias.has_value() || bias->device() == x.device(),
                    "quantized_linear: bias is on ", bias->device(), " but x is on ", x.device());
  if (qweight.dim() == 3) return quantized_linear_panels_cpu(x, qweight, scales, mins, bias);
  TORCH_CHECK_VALUE(scales.scalar_type() != at::kChar, "quantized_linear: int8 (K-quant) scales "
                    "are for the panel layout; the row layout takes float32 or float16 scales");
  const bool int4 = qweight.scalar_type() == at::kByte;
  TORCH_CHECK_VALUE(int4 || qweight.scalar_type() == at::kChar,
                    "quantized_linear: qweight must be int8 or uint8 (packed int4), got ",
                    qweight.scalar_type());
  const int64_t K = x.size(-1);
  const int64_t N = qweight.size(0);
  TORCH_CHECK_VALUE(qweight.size(1) == (int4 ? K / 2 : K) && (!int4 || K % 2 == 0),
                    "quantized_linear: x has shape ", x.sizes(), " but qweight (", qweight.scalar_type(),
                    ") has shape ", qweight.sizes(), "; expected [N, ", int4 ? "K / 2" : "K", "]");
  TORCH_CHECK_VALUE(scales.dim() == 2 && scales.size(0) == N && scales.size(1) >= 1,
                    "quantized_linear: scales must have shape [N, K / group] with N = ", N, ", got ",
                    scales.sizes());
  const int64_t groups = scales.size(1);
  const int64_t group = K / groups;
  const int64_t min_group = int4 ? 32 : 16;
  TORCH_CHECK_VALUE(group * groups == K && is_power_of_two(group) && group >= min_group,
                    "quantized_linear: scales has shape ", scales.sizes(), " for K = ", K,
                    ": the group K / scales.size(1) must be a power of two >= ", min_group,
                    " for ", int4 ? "int4" : "int8", " weights");
  check_scales_and_mins(scales, mins);
  return linear_with(x, scales, mins, bias, qweight, N, [&](auto scale_tag, const Operands& op, float* out) {
    using S = decltype(scale_tag);
    if constexpr (!std::is_same_v<S, qpanel::KScale>) {  // K-quant scales were refused above
      const QuantizedRows xq = quantized_rows(
          op, [&](auto rows) { return qdot::quantize_rows(rows, op.M, op.K, group, int4, op.level); });
      const QuantizedWeights<S> w{static_cast<const uint8_t*>(op.q.const_data_ptr()), op.s.const_data_ptr<S>(),
                                  op.mn.defined() ? op.mn.const_data_ptr<S>() : nullptr, op.q.size(1), groups,
                                  group};
      const auto& tiles = int4 ? qdot::qtiles_for<S, true>(op.level) : qdot::qtiles_for<S, false>(op.level);
      qlinear_rows(xq, w, N, out, tiles);
    }
  });
}

}  // namespace

PanelLinear panel_linear(const at::Tensor& qweight, const at::Tensor& scales,
                         const std::optional<at::Tensor>& mins, int64_t K) {
  const bool int4 = qweight.scalar_type() == at::kByte;
  TORCH_CHECK_VALUE((int4 || qweight.scalar_type() == at::kChar) &&
                        qweight.size(2) == qpanel::block_bytes(int4),
                    "quantized_linear: a 3-D qweight is the panel layout, uint8 [N / 16, K / 32, 256] "
                    "(int4) or int8 [N / 16, K / 32, 512]; got ", qweight.scalar_type(), " ", qweight.sizes());
  const int64_t panels = qweight.size(0), blocks = qweight.size(1);
  TORCH_CHECK_VALUE(blocks * qpanel::kBlock == K, "quantized_linear: x has ", K, " columns but the panel qweight has shape ", qweight.sizes(), "; expected [N / 16, K / 32 = ",
                    K / qpanel::kBlock, ", ", qpanel::block_bytes(int4), "] with K a multiple of 32");
  // K-quant scales as the file holds them (int8 sub-scales and float16 super-scales, per
  // super-block of 8 blocks; cpu_qpanel.h), or float scales per block.
  const bool kquant = scales.scalar_type() == at::kChar;
  auto entries_of = [&](int64_t width) { return kquant ? (width - 32) / qpanel::kSuperBlock : width; };
  // int8 in groups of 16 (a Q6_K's sub-blocks): a scale per row and half block.
  const bool halves = !int4 && scales.dim() == 3 && entries_of(scales.size(2)) == qpanel::scales_per_block(true);
  const int64_t entries = qpanel::scales_per_block(halves);
  if (kquant) {
    TORCH_CHECK_VALUE(scales.dim() == 3 && scales.size(0) == panels && blocks % qpanel::kSuperBlock == 0 &&
                          scales.size(1) == blocks / qpanel::kSuperBlock &&
                          scales.size(2) == qpanel::kSuperBlock * entries + 32,
                      "quantized_linear: int8 (K-quant) scales of a panel qweight of shape ",
                      qweight.sizes(), " must have shape [", panels, ", K / 256 = ",
                      blocks / qpanel::kSuperBlock, ", 160] (or [.., .., 288]: int8 in groups of "
                      "16), with K a multiple of 256; got ", scales.sizes());
  } else {
    TORCH_CHECK_VALUE(scales.dim() == 3 && scales.size(0) == panels && scales.size(1) == blocks &&
                          scales.size(2) == entries,
                      "quantized_linear: with a panel qweight of shape ", qweight.sizes(),
                      " scales must have shape [", panels, ", ", blocks, ", 16]",
                      int4 ? "" : " (or [.., .., 32]: int8 in groups of 16)", ", got ", scales.sizes());
  }
  TORCH_CHECK_VALUE(!halves || !mins.has_value(),
                    "quantized_linear: int8 panels in groups of 16 take no mins (scales of shape ",
                    scales.sizes(), ")");
  check_scales_and_mins(scales, mins);
  PanelLinear w;
  w.qweight = qweight.contiguous();
  w.scales = scales.contiguous();
  if (mins.has_value()) w.mins = mins->contiguous();
  w.N = panels * qpanel::kPanelRows;
  w.K = K;
  w.panels = panels;
  w.blocks = blocks;
  w.entries = entries;
  w.int4 = int4;
  w.kquant = kquant;
  w.halves = halves;
  return w;
}

void run_panel_linear(const PanelLinear& w, const float* x, int64_t M, float* out,
                      qpanel::PanelRows& rows) {
  run_panel_rows(w, x, M, out, rows);
}

void run_panel_linear(const PanelLinear& w, const c10::BFloat16* x, int64_t M, float* out,
                      qpanel::PanelRows& rows) {
  run_panel_rows(w, x, M, out, rows);
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("quantized_linear", &quantized_linear_cpu); }

}  // namespace specdec
