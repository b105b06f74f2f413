// CPU kernel of small_batch_linear: out[m, n] = x[m, :] . W[n, :] (+ bias[n]) for the few rows
// of a decoding or verification forward.
//
// Why a kernel of our own: torch runs one row as a matrix-vector product that streams W once,
// and 2..32 rows as a general GEMM that packs W on every call, so verifying 8 tokens cost
// 1.5-2x one token here. This kernel streams each weight row once for all M rows: a tile of
// NR weight rows is loaded once per 16 (32 for bf16) columns and multiplied into MR x rows at a
// time, so the cost stays near one row's until the FMA units, not memory, become the limit.
//
// Batch invariance by construction: out[m, n] is accumulated lane by lane over K in one fixed
// order (lane l sums columns l, l + 16, ...; then a fixed reduction tree; then the bias),
// whatever M is, wherever row m sits and however the rows are tiled or the columns split over
// threads. A row's result is therefore bit-identical alone or in a batch: a verification forward
// over K tokens yields exactly the logits of one-token decoding. (The result depends on the
// instruction set, chosen once per process.)
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "cpu_dot.h"
#include "cpu_linear.h"
#include "linear_common.h"

namespace specdec {
namespace {

using dot::TileTable;

// One call's operands, row-major with leading dimensions (elements).
template <typename T>
struct LinearOperands {
  const T* x;     // [M, K], rows ldx apart
  const T* w;     // [N, K], rows ldw apart
  const T* bias;  // [N] or nullptr
  T* out;         // [M, N], rows ldo apart
  int64_t ldx, ldw, ldo, M, N, K;
};

// ----------------------------------------------------------------------------- driver

// Rows per pass over the weights: larger batches (prefill) take several passes, so the rows of
// a pass stay in cache while the weights stream by; nothing per element changes.
constexpr int64_t kRowsPerPass = 128;

// Weight tiles whose rows, with the row tiles passing over them, span more bytes than this are
// multiplied block by block along K (TileTable::block_columns), so that they stay in L1 (48 KB
// on Zen 4 / 5) as every row tile passes: the default model's down projection (K = 1536) at 8
// rows was 1.6x its one-row time on AVX-512, L1-bound, and is now about 1.05x.
constexpr int64_t kL1Budget = 32 * 1024;

// Blocking pays while the weights' stream bounds a call; with more row tiles than this the
// tiles are bound by the FMA rate and the carried accumulators only cost (the default model's
// float32 linears at 64 and 128 rows: 6% slower blocked, at 32 rows 2% faster).
constexpr int64_t kMaxBlockedRowTiles = 6;

// out rows [0, M) of one pass; `x` holds the rows as the tiles take them (float32 when
// tiles.float_rows), `ldx` apart.
template <typename T>
void linear_pass(const LinearOperands<T>& op, const void* x, int64_t ldx, const TileTable& tiles) {
  const bool single = op.M == 1;
  const int weight_tile = single ? tiles.single_row_tile : tiles.weight_tile;
  const int64_t num_tiles = (op.N + weight_tile - 1) / weight_tile;
  // Enough weight bytes per task to amortise the scheduling (~64 KB).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, weight_tile * op.K * sizeof(T)));
  // Row tiles as even as possible (5 rows: 3 + 2, not 4 + 1): a row's result does not depend on
  // its tile, and even tiles keep more accumulators busy.
  const int64_t row_tiles = (op.M + tiles.row_tile - 1) / tiles.row_tile;
  const size_t x_size = tiles.float_rows ? sizeof(float) : sizeof(T);
  const int64_t line_steps = op.K * static_cast<int64_t>(sizeof(T)) / 64;  // per tile call
  const int64_t block = tiles.block_columns;
  const int64_t footprint =
      (std::min<int64_t>(op.M, tiles.row_tile) * static_cast<int64_t>(x_size) +
       weight_tile * static_cast<int64_t>(sizeof(T))) * op.K;
  const bool blocked = !single && block > 0 && op.K > block && footprint > kL1Budget &&
                       row_tiles <= kMaxBlockedRowTiles;
  // One row tile's accumulators (at most 16 lanes each) between blocks.
  const int64_t carry_per_tile = int64_t{tiles.row_tile} * tiles.weight_tile * 16;
  at::parallel_for(0, num_tiles, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> carry(blocked ? row_tiles * carry_per_tile : 0);
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t n0 = tile * weight_tile;
      const int nr = static_cast<int>(std::min<int64_t>(weight_tile, op.N - n0));
      const T* w = op.w + n0 * op.ldw;
      const T* bias = op.bias == nullptr ? nullptr : op.bias + n0;
      // The next weight tile is fetched while this one is multiplied (contiguous rows only),
      // spread over this tile's calls: `lines` per 64 bytes of weight row each call consumes.
      const bool ahead = tile + 1 < end && op.ldw == op.K;
      const char* next = ahead ? reinterpret_cast<const char*>(w + weight_tile * op.ldw) : nullptr;
      const int64_t next_rows = ahead ? std::min<int64_t>(weight_tile, op.N - n0 - weight_tile) : 0;
      const int lines = static_cast<int>((next_rows + row_tiles - 1) / row_tiles);
      if (single) {
        tiles.single[nr - 1](x, ldx, w, op.ldw, op.K, bias, op.out + n0, op.ldo, next, lines);
        continue;
      }
      // The weight tile stays in cache while every row tile passes over it (block by block
      // over K when blocked: the same FMAs in the same order).
      const int64_t step = blocked ? block : op.K;
      for (int64_t k0 = 0; k0 < op.K; k0 += step) {
        const int64_t k1 = std::min(op.K, k0 + step);
        const int64_t steps =
            blocked ? ((k1 - k0) * static_cast<int64_t>(sizeof(T)) + 63) / 64 : line_steps;
        int64_t m0 = 0;
        for (int64_t r = 0; r < row_tiles; ++r) {
          const int mr = static_cast<int>(op.M / row_tiles + (r < op.M % row_tiles ? 1 : 0));
          const void* xr = static_cast<const char*>(x) + m0 * ldx * x_size;
          T* out = op.out + m0 * op.ldo + n0;
          if (blocked) {
            tiles.partial[mr - 1][nr - 1](xr, ldx, w, op.ldw, k0, k1, op.K, k0 == 0, k1 == op.K,
                                          carry.data() + r * carry_per_tile, bias, out, op.ldo,
                                          next, lines);
          } else {
            tiles.table[mr - 1][nr - 1](xr, ldx, w, op.ldw, op.K, bias, out, op.ldo, next, lines);
          }
          if (next != nullptr) next += static_cast<int64_t>(lines) * steps * 64;
          m0 += mr;
        }
      }
    }
  });
}

template <typename T>
void linear_rows(const LinearOperands<T>& op, const TileTable& tiles) {
  // Tiles that take float32 rows get bfloat16 rows widened once (exactly), not per weight tile.
  std::vector<float> widened;
  const void* x = op.x;
  int64_t ldx = op.ldx;
  if (tiles.float_rows && !std::is_same_v<T, float>) {
    widened.resize(op.M * op.K);
    for (int64_t m = 0; m < op.M; ++m)
      for (int64_t k = 0; k < op.K; ++k) widened[m * op.K + k] = static_cast<float>(op.x[m * op.ldx + k]);
    x = widened.data();
    ldx = op.K;
  }
  const size_t x_size = tiles.float_rows ? sizeof(float) : sizeof(T);
  for (int64_t m0 = 0; m0 < op.M; m0 += kRowsPerPass) {
    LinearOperands<T> pass = op;
    pass.out = op.out + m0 * op.ldo;
    pass.M = std::min(kRowsPerPass, op.M - m0);
    linear_pass(pass, static_cast<const char*>(x) + m0 * ldx * x_size, ldx, tiles);
  }
}

}  // namespace

void run_small_batch_linear(const float* x, int64_t M, const at::Tensor& weight, const float* bias,
                            float* out) {
  const at::Tensor w = weight.stride(1) == 1 ? weight : weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1);
  const LinearOperands<float> op{x, w.const_data_ptr<float>(), bias, out, K, w.stride(0), N, M, N, K};
  linear_rows(op, dot::tiles_for<float>(simd::max_level()));
}

namespace {

at::Tensor small_batch_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias) {
  const int64_t N = check_small_batch_linear_args(x, weight, bias);
  const int64_t K = weight.size(1);
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16,
                    "small_batch_linear: x must be float32 or bfloat16, got ", dtype);
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = N;
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  if (M == 0 || N == 0) return at::empty(out_sizes, x.options());
  if (K == 0) {
    at::Tensor out = at::zeros(out_sizes, x.options());
    return bias.has_value() ? out.add_(*bias) : out;
  }
  const at::Tensor rows = x.contiguous();  // M rows of K, whatever the leading shape
  // Weight rows must have unit column stride; a transposed view would be copied on every call.
  const at::Tensor w = weight.stride(1) == 1 ? weight : weight.contiguous();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty(out_sizes, x.options());  // M rows of N: no view to dispatch
  const int level = simd::max_level();
  if (dtype == at::kFloat) {
    run_small_batch_linear(rows.const_data_ptr<float>(), M, w,
                           b.defined() ? b.const_data_ptr<float>() : nullptr,
                           out.mutable_data_ptr<float>());
  } else {
    using bf16 = c10::BFloat16;
    const LinearOperands<bf16> op{rows.const_data_ptr<bf16>(), w.const_data_ptr<bf16>(),
                                  b.defined() ? b.const_data_ptr<bf16>() : nullptr,
                                  out.mutable_data_ptr<bf16>(), K, w.stride(0), N, M, N, K};
    linear_rows(op, dot::tiles_for<bf16>(level));
  }
  return out;
}

// The instruction set the CPU kernels use; `cap` >= 0 caps it (tests), -1 lifts the cap, any
// other value only asks.
std::string cpu_isa(int64_t cap) {
  if (cap >= -1) {
    TORCH_CHECK_VALUE(cap <= simd::kAvx512Bf16, "cpu_isa: cap must be -1 .. ", int(simd::kAvx512Bf16),
                      ", got ", cap);
    simd::level_cap().store(static_cast<int>(cap));
  }
  return simd::level_name(simd::max_level());
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("small_batch_linear", &small_batch_linear_cpu); }

// No tensor arguments: one kernel for every backend.
TORCH_LIBRARY_IMPL(specdec, CompositeImplicitAutograd, m) { m.impl("cpu_isa", &cpu_isa); }

}  // namespace specdec
