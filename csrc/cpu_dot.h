// Fixed-order dot-product tiles of the CPU kernels: out[m, n] = x[m, :] . w[n, :] for a tile of
// MR x rows against NR w rows, every element accumulated lane by lane over K in one fixed order
// (lane l sums columns l, l + L, ...; then the fixed reduction tree of cpu_simd.h; then the
// bias), whatever the tile shape, so results do not depend on how rows are grouped. Used by
// small_batch_linear (csrc/linear.cpp) and the CPU tree attention (csrc/tree.cpp).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu_simd.h"

namespace specdec {
namespace dot {

// `prefetch`: memory the caller needs next (the next weight tile), `prefetch_lines` 64-byte lines
// of it fetched into L2 per 64 bytes of each weight row the tile consumes, so DRAM keeps
// streaming while the FMA units work. AVX2 tiles take x as float32 when the table says so
// (TileTable::float_rows: the caller widens bfloat16 rows once instead of once per weight tile).
using TileFn = void (*)(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t K,
                        const void* bias, void* out, int64_t ldo, const char* prefetch,
                        int prefetch_lines);

// Columns [k0, k1) of a tile, for weights too wide for a weight tile and the row tiles passing
// over it to share L1: the MR x NR vector accumulators start from `carry` (unless `first`) and
// go back to it (unless `last`, where they are reduced and stored as out). A tile run block by
// block over K makes the same FMAs in the same order as one call over all of K: same bits.
// k0 and every block end but K are multiples of the tile's K step and of a cache line.
using PartialFn = void (*)(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t k0,
                           int64_t k1, int64_t K, bool first, bool last, float* carry,
                           const void* bias, void* out, int64_t ldo, const char* prefetch,
                           int prefetch_lines);

// Bounds of the tile tables: MR x rows against NR weight rows, MR * NR vector accumulators in
// registers. Each instruction set picks its shapes within them (TileTable), for its register
// file: one-row calls use wider weight tiles so enough independent FMAs are in flight.
constexpr int kMaxRowTile = 6;
constexpr int kMaxWeightTile = 4;
constexpr int kMaxSingleRowTile = 8;

// Fetches the next `lines` cache lines of `cursor` into L2 and advances it (nullptr: nothing).
inline void prefetch_step(const char*& cursor, int lines) {
  if (cursor == nullptr) return;
  for (int i = 0; i < lines; ++i, cursor += 64) __builtin_prefetch(cursor, 0, 2);
}

// ----------------------------------------------------------------------------- portable

// Eight partial sums by column mod 8, combined in a fixed order.
template <typename T>
float dot_portable(const T* x, const T* w, int64_t K) {
  float part[8] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int l = 0; l < 8; ++l) part[l] += static_cast<float>(x[k + l]) * static_cast<float>(w[k + l]);
  for (int l = 0; k < K; ++k, ++l) part[l] += static_cast<float>(x[k]) * static_cast<float>(w[k]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

template <typename T>
void store(T* out, float value) {
  *out = static_cast<T>(value);
}

template <>
inline void store<c10::BFloat16>(c10::BFloat16* out, float value) {
  *out = c10::BFloat16(simd::f32_to_bf16_bits(value), c10::BFloat16::from_bits());
}

template <typename T, int MR, int NR>
void tile_portable(const void* xv, int64_t ldx, const void* wv, int64_t ldw, int64_t K,
                   const void* biasv, void* outv, int64_t ldo, const char*, int) {
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  const T* bias = static_cast<const T*>(biasv);
  T* out = static_cast<T*>(outv);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      float sum = dot_portable(x + m * ldx, w + n * ldw, K);
      if (bias != nullptr) sum += static_cast<float>(bias[n]);
      store(out + m * ldo + n, sum);
    }
}

#if SPECDEC_X86
// Every vector tile walks K the same way: whole vectors (with a prefetch step at the start of
// each cache line of the weight rows), then a zero-filled tail (zero lanes add exact zeros).
// The order each lane sums in is the same whatever the tile shape.

// ----------------------------------------------------------------------------- AVX-512

// Loads 16 values of a row as float32 (bf16 widened exactly); `count` < 16 zero-fills the rest.
SPECDEC_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_TARGET_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  return simd::bf16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
SPECDEC_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
SPECDEC_TARGET_AVX512 inline __m512 load16(const c10::BFloat16* p, __mmask16 mask) {
  return simd::bf16_to_f32(_mm256_maskz_loadu_epi16(mask, p));
}

// 16 columns from k of MR rows against NR weight rows.
template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX512 __attribute__((always_inline)) inline void step_avx512(
    const T* x, int64_t ldx, const T* w, int64_t ldw, int64_t k, __m512 (&acc)[MR][NR]) {
  __m512 wr[NR];
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n) wr[n] = load16(w + n * ldw + k);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    const __m512 xr = load16(x + m * ldx + k);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(xr, wr[n], acc[m][n]);
  }
}

// out[m, n] = the fixed reduction of acc[m][n] (cpu_simd.h, four outputs at a time), plus the bias.
template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX512 __attribute__((always_inline)) inline void store_avx512(
    const __m512 (&acc)[MR][NR], const T* bias, T* out, int64_t ldo) {
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    float sums[NR];
    simd::reduce_add_each<NR>(acc[m], sums);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) store(out + m * ldo + n, bias != nullptr ? sums[n] + static_cast<float>(bias[n]) : sums[n]);
  }
}

template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX512 __attribute__((always_inline)) inline void range_avx512(
    const T* x, int64_t ldx, const T* w, int64_t ldw, int64_t k0, int64_t k1, int64_t K,
    __m512 (&acc)[MR][NR], const char*& prefetch, int prefetch_lines) {
  constexpr int64_t kLine = 64 / sizeof(T);  // columns per cache line of a weight row
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    if ((k & (kLine - 1)) == 0) prefetch_step(prefetch, prefetch_lines);
    step_avx512<T, MR, NR>(x, ldx, w, ldw, k, acc);
  }
  if (k < k1) {  // the tail of K (only the last block has one)
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1u);
    __m512 wr[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) wr[n] = load16(w + n * ldw + k, mask);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 xr = load16(x + m * ldx + k, mask);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(xr, wr[n], acc[m][n]);
    }
  }
}

template <int MR, int NR>
SPECDEC_TARGET_AVX512 __attribute__((always_inline)) inline void carry_in_avx512(
    __m512 (&acc)[MR][NR], const float* carry, bool first) {
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n)
      acc[m][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(carry + (m * NR + n) * 16);
}

template <int MR, int NR>
SPECDEC_TARGET_AVX512 __attribute__((always_inline)) inline void carry_out_avx512(
    const __m512 (&acc)[MR][NR], float* carry) {
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) _mm512_storeu_ps(carry + (m * NR + n) * 16, acc[m][n]);
}

template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX512 void tile_avx512(const void* xv, int64_t ldx, const void* wv, int64_t ldw,
                                       int64_t K, const void* biasv, void* outv, int64_t ldo,
                                       const char* prefetch, int prefetch_lines) {
  __m512 acc[MR][NR];
  carry_in_avx512<MR, NR>(acc, nullptr, true);
  range_avx512<T, MR, NR>(static_cast<const T*>(xv), ldx, static_cast<const T*>(wv), ldw, 0, K,
                          K, acc, prefetch, prefetch_lines);
  store_avx512<T, MR, NR>(acc, static_cast<const T*>(biasv), static_cast<T*>(outv), ldo);
}

template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX512 void partial_avx512(const void* xv, int64_t ldx, const void* wv,
                                          int64_t ldw, int64_t k0, int64_t k1, int64_t K,
                                          bool first, bool last, float* carry, const void* biasv,
                                          void* outv, int64_t ldo, const char* prefetch,
                                          int prefetch_lines) {
  __m512 acc[MR][NR];
  carry_in_avx512<MR, NR>(acc, carry, first);
  range_avx512<T, MR, NR>(static_cast<const T*>(xv), ldx, static_cast<const T*>(wv), ldw, k0, k1,
                          K, acc, prefetch, prefetch_lines);
  if (last) {
    store_avx512<T, MR, NR>(acc, static_cast<const T*>(biasv), static_cast<T*>(outv), ldo);
  } else {
    carry_out_avx512<MR, NR>(acc, carry);
  }
}

// bfloat16 x and W with vdpbf16ps: each instruction multiplies 32 pairs exactly and adds them
// into 16 float32 lanes (pairs 2l, 2l + 1 into lane l). One step is one cache line of W.
template <int MR, int NR>
SPECDEC_TARGET_AVX512BF16 void tile_avx512_bf16dp(const void* xv, int64_t ldx, const void* wv,
                                                  int64_t ldw, int64_t K, const void* biasv,
                                                  void* outv, int64_t ldo, const char* prefetch,
                                                  int prefetch_lines) {
  const uint16_t* x = static_cast<const uint16_t*>(xv);
  const uint16_t* w = static_cast<const uint16_t*>(wv);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    prefetch_step(prefetch, prefetch_lines);
    __m512bh wr[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) wr[n] = (__m512bh)_mm512_loadu_si512(w + n * ldw + k);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh xr = (__m512bh)_mm512_loadu_si512(x + m * ldx + k);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xr, wr[n]);
    }
  }
  if (k < K) {
    const __mmask32 mask = static_cast<__mmask32>((1ull << (K - k)) - 1ull);
    __m512bh wr[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) wr[n] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + n * ldw + k);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh xr = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * ldx + k);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xr, wr[n]);
    }
  }
  store_avx512<c10::BFloat16, MR, NR>(acc, static_cast<const c10::BFloat16*>(biasv),
                                      static_cast<c10::BFloat16*>(outv), ldo);
}

// ----------------------------------------------------------------------------- AVX2
//
// 16 ymm registers: MR * NR accumulators, plus the smaller of the two operand sets held for the
// step (the other streamed one vector at a time), must fit, or the accumulators spill. x comes
// as float32 (bfloat16 rows are widened once by the caller); W as float32 or bfloat16.

SPECDEC_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_TARGET_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  return simd::bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The first `count` (< 8) values at p, zero-filled.
SPECDEC_TARGET_AVX2 inline __m256 load8_tail(const float* p, int64_t count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane));
}
SPECDEC_TARGET_AVX2 inline __m256 load8_tail(const c10::BFloat16* p, int64_t count) {
  uint16_t buffer[8] = {};
  std::memcpy(buffer, p, count * sizeof(uint16_t));
  return simd::bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(buffer)));
}

template <bool kTail, typename T>
SPECDEC_TARGET_AVX2 __attribute__((always_inline)) inline __m256 load8_at(const T* p, int64_t count) {
  if constexpr (kTail) {
    return load8_tail(p, count);
  } else {
    return load8(p);
  }
}

// 8 columns from k of MR float32 rows against NR weight rows (`count` < 8: the tail).
template <typename T, int MR, int NR, bool kTail = false>
SPECDEC_TARGET_AVX2 __attribute__((always_inline)) inline void step_avx2(
    const float* x, int64_t ldx, const T* w, int64_t ldw, int64_t k, __m256 (&acc)[MR][NR],
    int64_t count = 8) {
  if constexpr (MR <= NR) {  // hold the rows, stream the weights
    __m256 xr[MR];
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) xr[m] = load8_at<kTail>(x + m * ldx + k, count);
#pragma GCC unroll 12
    for (int n = 0; n < NR; ++n) {
      const __m256 wn = load8_at<kTail>(w + n * ldw + k, count);
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) acc[m][n] = _mm256_fmadd_ps(xr[m], wn, acc[m][n]);
    }
  } else {  // hold the weights, stream the rows
    __m256 wr[NR];
#pragma GCC unroll 12
    for (int n = 0; n < NR; ++n) wr[n] = load8_at<kTail>(w + n * ldw + k, count);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m256 xm = load8_at<kTail>(x + m * ldx + k, count);
#pragma GCC unroll 12
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xm, wr[n], acc[m][n]);
    }
  }
}

template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX2 void tile_avx2(const void* xv, int64_t ldx, const void* wv, int64_t ldw,
                                   int64_t K, const void* biasv, void* outv, int64_t ldo,
                                   const char* prefetch, int prefetch_lines) {
  constexpr int64_t kLine = 64 / sizeof(T);  // columns per cache line of a weight row
  const float* x = static_cast<const float*>(xv);
  const T* w = static_cast<const T*>(wv);
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 12
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    // (A branch, not an unrolled inner loop: unrolling makes GCC shuffle the accumulators.)
    if ((k & (kLine - 1)) == 0) prefetch_step(prefetch, prefetch_lines);
    step_avx2<T, MR, NR>(x, ldx, w, ldw, k, acc);
  }
  if (k < K) step_avx2<T, MR, NR, true>(x, ldx, w, ldw, k, acc, K - k);
  const T* bias = static_cast<const T*>(biasv);
  T* out = static_cast<T*>(outv);
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) {
    float sums[NR];
    simd::reduce_add_each<NR>(acc[m], sums);
#pragma GCC unroll 12
    for (int n = 0; n < NR; ++n) store(out + m * ldo + n, bias != nullptr ? sums[n] + static_cast<float>(bias[n]) : sums[n]);
  }
}
#endif  // SPECDEC_X86

// ----------------------------------------------------------------------------- tile tables

// The tiles of one instruction set and element type: table[mr - 1][nr - 1] for mr <= row_tile
// and nr <= weight_tile, and the one-row tiles single[nr - 1] for nr <= single_row_tile.
struct TileTable {
  int row_tile = 1;
  int weight_tile = 1;
  int single_row_tile = 1;
  bool float_rows = false;  // x is passed as float32 (bfloat16 rows widened by the caller)
  TileFn table[kMaxRowTile][kMaxWeightTile] = {};
  TileFn single[kMaxSingleRowTile] = {};
  // The same shapes block by block over K (nullptr where the table never blocks), and the
  // block's columns (0: never blocked). Only the AVX-512 float32 tiles block (128 columns): the default model's float32 decoding linears at 8 / 16 rows took 6-7% less time
  // on AVX-512, and up to 14% more on the AVX2 path, whose tiles are bound by the FMA rate there
  // (bench/RESULTS.md, 2026-11-28, twentieth session).
  PartialFn partial[kMaxRowTile][kMaxWeightTile] = {};
  int64_t block_columns = 0;
};

template <template <int, int> class Make, int MR, int... NR>
void fill_row(TileFn* row, std::integer_sequence<int, NR...>) {
  ((row[NR] = Make<MR, NR + 1>::fn), ...);
}

template <template <int, int> class Make, int MR, int... NR>
void fill_partial_row(PartialFn* row, std::integer_sequence<int, NR...>) {
  ((row[NR] = Make<MR, NR + 1>::partial), ...);
}

template <template <int, int> class Make, int WeightTile, int... MR>
void fill_table(TileTable& t, std::integer_sequence<int, MR...>) {
  (fill_row<Make, MR + 1>(t.table[MR], std::make_integer_sequence<int, WeightTile>{}), ...);
  (fill_partial_row<Make, MR + 1>(t.partial[MR], std::make_integer_sequence<int, WeightTile>{}),
   ...);
}

// The tiles Make<mr, nr>::fn of the shape RowTile x WeightTile (and one-row tiles up to
// SingleRowTile weight rows).
template <template <int, int> class Make, int RowTile, int WeightTile, int SingleRowTile>
TileTable make_table(bool float_rows = false, int64_t block_columns = 0) {
  static_assert(RowTile <= kMaxRowTile && WeightTile <= kMaxWeightTile &&
                SingleRowTile <= kMaxSingleRowTile);
  TileTable t;
  t.row_tile = RowTile;
  t.weight_tile = WeightTile;
  t.single_row_tile = SingleRowTile;
  t.float_rows = float_rows;
  t.block_columns = block_columns;
  fill_table<Make, WeightTile>(t, std::make_integer_sequence<int, RowTile>{});
  fill_row<Make, 1>(t.single, std::make_integer_sequence<int, SingleRowTile>{});
  return t;
}

template <typename T>
struct PortableTile {
  template <int MR, int NR>
  struct Make {
    static constexpr TileFn fn = &tile_portable<T, MR, NR>;
    static constexpr PartialFn partial = nullptr;
  };
};

#if SPECDEC_X86
template <typename T>
struct Avx512Tile {
  template <int MR, int NR>
  struct Make {
    static constexpr TileFn fn = &tile_avx512<T, MR, NR>;
    static constexpr PartialFn partial =
        std::is_same_v<T, float> ? &partial_avx512<T, MR, NR> : nullptr;
  };
};

template <int MR, int NR>
struct Avx512Bf16DotTile {
  static constexpr TileFn fn = &tile_avx512_bf16dp<MR, NR>;
  static constexpr PartialFn partial = nullptr;
};

template <typename T>
struct Avx2Tile {
  template <int MR, int NR>
  struct Make {
    static constexpr TileFn fn = &tile_avx2<T, MR, NR>;
    static constexpr PartialFn partial = nullptr;
  };
};
#endif

// The tiles of the best instruction set allowed, for element type T. Shapes: AVX-512 (32 zmm)
// 4 x 4 = 16 accumulators + 4 weight + 1 row vectors; AVX2 (16 ymm) 4 x 3 = 12 accumulators +
// 3 weight + 1 row vectors; one row against 8 weight rows on both (the weights are read as
// memory operands of the FMAs).
template <typename T>
const TileTable& tiles_for(int level) {
  static const TileTable portable = make_table<PortableTile<T>::template Make, 4, 4, 8>();
#if SPECDEC_X86
  static const TileTable avx2 = make_table<Avx2Tile<T>::template Make, 4, 3, 8>(true);
  static const TileTable avx512 = make_table<Avx512Tile<T>::template Make, 6, 4, 8>(
      false, std::is_same_v<T, float> ? 128 : 0);
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    static const TileTable bf16dp = make_table<Avx512Bf16DotTile, 6, 4, 8>();
    if (level >= simd::kAvx512Bf16) return bf16dp;
  }
  if (level >= simd::kAvx512) return avx512;
  if (level >= simd::kAvx2) return avx2;
#endif
  (void)level;
  return portable;
}

}  // namespace dot
}  // namespace specdec
