// Fixed-order dot-product tiles of the CPU kernels: out[m, n] = x[m, :] . w[n, :] for a tile of
// MR x rows against NR w rows, every element accumulated lane by lane over K in one fixed order
// (lane l sums columns l, l + L, ...; then the fixed reduction tree of cpu_simd.h; then the
// bias), whatever the tile shape, so results do not depend on how rows are grouped. Used by
// small_batch_linear (csrc/linear.cpp) and the CPU tree attention (csrc/tree.cpp).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cpu_simd.h"

namespace specdec {
namespace dot {

// `prefetch`: memory the caller needs next (the next weight tile), `prefetch_lines` 64-byte lines
// of it fetched into L2 per K step, so DRAM keeps streaming while the FMA units work.
using TileFn = void (*)(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t K,
                        const void* bias, void* out, int64_t ldo, const char* prefetch,
                        int prefetch_lines);

// Largest tile: MR x rows against NR weight rows (MR * NR vector accumulators in registers).
// One-row calls use wider weight tiles so enough independent FMAs are in flight.
constexpr int kMaxRowTile = 4;
constexpr int kWeightTile = 4;
constexpr int kSingleRowWeightTile = 8;

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

template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX512 void tile_avx512(const void* xv, int64_t ldx, const void* wv, int64_t ldw,
                                       int64_t K, const void* biasv, void* outv, int64_t ldo,
                                       const char* prefetch, int prefetch_lines) {
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    prefetch_step(prefetch, prefetch_lines);
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
  if (k < K) {  // zero-filled lanes add exact zeros
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
  const T* bias = static_cast<const T*>(biasv);
  T* out = static_cast<T*>(outv);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      float sum = simd::reduce_add(acc[m][n]);
      if (bias != nullptr) sum += static_cast<float>(bias[n]);
      store(out + m * ldo + n, sum);
    }
}

// bfloat16 x and W with vdpbf16ps: each instruction multiplies 32 pairs exactly and adds them
// into 16 float32 lanes (pairs 2l, 2l + 1 into lane l).
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
  const uint16_t* bias = static_cast<const uint16_t*>(biasv);
  c10::BFloat16* out = static_cast<c10::BFloat16*>(outv);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      float sum = simd::reduce_add(acc[m][n]);
      if (bias != nullptr) sum += simd::bf16_bits_to_f32(bias[n]);
      store(out + m * ldo + n, sum);
    }
}

// ----------------------------------------------------------------------------- AVX2

SPECDEC_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_TARGET_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  return simd::bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The last `count` (< 8) values of a row, zero-filled.
template <typename T>
SPECDEC_TARGET_AVX2 inline __m256 load8_tail(const T* p, int64_t count) {
  T buffer[8] = {};
  for (int64_t i = 0; i < count; ++i) buffer[i] = p[i];
  return load8(buffer);
}

template <typename T, int MR, int NR>
SPECDEC_TARGET_AVX2 void tile_avx2(const void* xv, int64_t ldx, const void* wv, int64_t ldw,
                                   int64_t K, const void* biasv, void* outv, int64_t ldo,
                                   const char* prefetch, int prefetch_lines) {
  const T* x = static_cast<const T*>(xv);
  const T* w = static_cast<const T*>(wv);
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    prefetch_step(prefetch, prefetch_lines);
    __m256 wr[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) wr[n] = load8(w + n * ldw + k);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 xr = load8(x + m * ldx + k);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xr, wr[n], acc[m][n]);
    }
  }
  if (k < K) {
    __m256 wr[NR];
    for (int n = 0; n < NR; ++n) wr[n] = load8_tail(w + n * ldw + k, K - k);
    for (int m = 0; m < MR; ++m) {
      const __m256 xr = load8_tail(x + m * ldx + k, K - k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xr, wr[n], acc[m][n]);
    }
  }
  const T* bias = static_cast<const T*>(biasv);
  T* out = static_cast<T*>(outv);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      float sum = simd::reduce_add(acc[m][n]);
      if (bias != nullptr) sum += static_cast<float>(bias[n]);
      store(out + m * ldo + n, sum);
    }
}
#endif  // SPECDEC_X86

// ----------------------------------------------------------------------------- tile tables

// table[mr - 1][nr - 1] for mr <= kMaxRowTile (nr <= kWeightTile), plus the one-row tiles
// single[nr - 1] for nr <= kSingleRowWeightTile.
struct TileTable {
  TileFn table[kMaxRowTile][kWeightTile];
  TileFn single[kSingleRowWeightTile];
};

template <template <int, int> class Make, int MR, int... NR>
void fill_row(TileFn* row, std::integer_sequence<int, NR...>) {
  ((row[NR] = Make<MR, NR + 1>::fn), ...);
}

template <template <int, int> class Make, int... MR>
void fill_table(TileTable& t, std::integer_sequence<int, MR...>) {
  (fill_row<Make, MR + 1>(t.table[MR], std::make_integer_sequence<int, kWeightTile>{}), ...);
}

template <template <int, int> class Make>
TileTable make_table() {
  TileTable t{};
  fill_table<Make>(t, std::make_integer_sequence<int, kMaxRowTile>{});
  fill_row<Make, 1>(t.single, std::make_integer_sequence<int, kSingleRowWeightTile>{});
  return t;
}

template <typename T>
struct PortableTile {
  template <int MR, int NR>
  struct Make {
    static constexpr TileFn fn = &tile_portable<T, MR, NR>;
  };
};

#if SPECDEC_X86
template <typename T>
struct Avx512Tile {
  template <int MR, int NR>
  struct Make {
    static constexpr TileFn fn = &tile_avx512<T, MR, NR>;
  };
};

template <int MR, int NR>
struct Avx512Bf16DotTile {
  static constexpr TileFn fn = &tile_avx512_bf16dp<MR, NR>;
};

template <typename T>
struct Avx2Tile {
  template <int MR, int NR>
  struct Make {
    static constexpr TileFn fn = &tile_avx2<T, MR, NR>;
  };
};
#endif

// The tiles of the best instruction set allowed, for element type T.
template <typename T>
const TileTable& tiles_for(int level) {
  static const TileTable portable = make_table<PortableTile<T>::template Make>();
#if SPECDEC_X86
  static const TileTable avx2 = make_table<Avx2Tile<T>::template Make>();
  static const TileTable avx512 = make_table<Avx512Tile<T>::template Make>();
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    static const TileTable bf16dp = make_table<Avx512Bf16DotTile>();
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
