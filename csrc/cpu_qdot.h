// Integer dot-product tiles of quantized_linear (csrc/quantized_linear.cpp): out[m, n] =
// x[m, :] . W[n, :] with W held as groups of int8 or int4 values along K, each group with a
// float scale (and optionally a min: w = scale * q + min), and x quantized per row to int8 in
// blocks of 32 (llama.cpp's way: the products are exact integer sums, four bytes at a time).
//
// Layouts (what the loader repacks GGUF blocks into, and what the reference reads):
//   int8: qweight [N, K] int8, signed; w = scale[g] * q + min[g].
//   int4: qweight [N, K / 2] uint8; in each 32-value block byte j holds value j (low nibble)
//         and value j + 16 (high nibble), both unsigned 0..15; w = scale[g] * q + min[g].
//   scale, min: [N, K / group] float32 or float16 (group a power of two, >= 16 for int8 and
//   >= 32 for int4).
//
// Batch invariance: every output element is accumulated in one fixed order that depends only
// on K and the group: an exact integer sum over each 4-value lane of a 64-byte chunk, then
// float32 lanes chunk after chunk (acc += float(isum) * (w_scale * x_scale)), then the min term
// (min[g] * group_sum[g]) added lane by lane (vector paths; the portable one sums it apart), then
// the fixed reduction tree of cpu_simd.h, then the bias. Nothing depends on M, on a row's place
// in the batch or on threads.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_simd.h"

namespace specdec {
namespace qdot {

// Activation blocks: one int8 scale per 32 values of a row.
constexpr int kXBlock = 32;
// Bytes of weights (and of quantized x per half) one vector step covers.
constexpr int kChunkBytes = 64;
// Values of K one chunk covers: 64 int8 values, or 128 int4 values (64 low + 64 high nibbles).
constexpr int chunk_values(bool int4) { return int4 ? 128 : 64; }
// Lanes (of 4 bytes) in a chunk.
constexpr int kLanes = 16;
// Weight tiles fetched ahead: the tiles read a few short rows at once (288-576 bytes at the
// default model's K = 576), too short for the hardware's stream prefetch to ramp up. Fetching
// the next tile's line beside each line read: the 135m LM head from memory 2.9 -> 1.6 ms (AVX2)
// and 2.25 -> 1.55 ms (AVX-512) on 2 threads; 2 or 4 tiles ahead measured no better.
constexpr int kPrefetchTiles = 1;
// A single row's tiles also fetch into L2 this many tiles ahead: one row does too little work
// per line for one tile's distance to cover the memory's latency (with the reductions below,
// a decoding step's quantized linears from memory, `bash bench/kernel_ab/run.sh`, Zen 4:
// AVX-512 4.98 -> 3.91 ms, AVX2 4.85 -> 4.22 ms). Tiles of several rows (compute-bound)
// measured 5-10% slower with it.
constexpr int kFarPrefetchTiles = 4;

// One row of x, quantized for the kernels.
//   q: K rounded up to whole chunks, int8, in kernel order: int8 weights read it as is;
//      int4 weights read, per chunk of 4 blocks, the 64 low-nibble partners (values 0..15 of
//      each block) then the 64 high-nibble partners (values 16..31).
//   lane_scale: per chunk, the x scale of each of the 16 lanes (the block its bytes belong to).
//   group_sum: per weight group, the sum of the dequantized x values (for the min term).
struct QuantizedRows {
  int64_t rows = 0, K = 0, padded = 0, groups = 0;
  bool int4 = false;
  std::vector<int8_t> q;
  std::vector<float> lane_scale;
  std::vector<float> group_sum;

  const int8_t* q_row(int64_t m) const { return q.data() + m * padded; }
  const float* lane_scale_row(int64_t m) const {
    return lane_scale.data() + m * (padded / chunk_values(int4)) * kLanes;
  }
  const float* group_sum_row(int64_t m) const { return group_sum.data() + m * groups; }
};

// One full block of 32 values: amax, then q = clamp(round-half-even(x * (127 / amax)), +-127)
// into low[0..15] (values 0..15) and high[0..15] (values 16..31), and the integer sums of the
// two halves. The vector versions do the same float operations lane by lane as the scalar
// one (a product, a rounding in the default mode, a clamp), so every path quantizes alike;
// they take 10x less time than the scalar loop, which was a third of a one-row call.
inline float quantize_block32_portable(const float* x, int8_t* low, int8_t* high,
                                       int32_t half_sum[2]) {
  float amax = 0.0f;
  for (int i = 0; i < kXBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
  half_sum[0] = half_sum[1] = 0;
  for (int i = 0; i < kXBlock; ++i) {
    const float v = std::nearbyint(x[i] * inverse);
    const int8_t qv = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v)));
    (i < 16 ? low[i] : high[i - 16]) = qv;
    half_sum[i / 16] += qv;
  }
  return amax;
}

#if SPECDEC_X86
// round-half-even(v * inverse) clamped to +-127, as int32 lanes.
SPECDEC_TARGET_AVX512 inline __m512i quantize16(__m512 v, __m512 inverse) {
  v = _mm512_roundscale_ps(_mm512_mul_ps(v, inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_cvtps_epi32(_mm512_max_ps(_mm512_set1_ps(-127.0f), _mm512_min_ps(_mm512_set1_ps(127.0f), v)));
}

SPECDEC_TARGET_AVX512 inline float quantize_block32_avx512(const float* x, int8_t* low,
                                                           int8_t* high, int32_t half_sum[2]) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const float amax = _mm512_reduce_max_ps(
      _mm512_max_ps(_mm512_and_ps(a, magnitude), _mm512_and_ps(b, magnitude)));
  const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m512i qa = quantize16(a, inverse), qb = quantize16(b, inverse);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(high), _mm512_cvtepi32_epi8(qb));
  half_sum[0] = _mm512_reduce_add_epi32(qa);
  half_sum[1] = _mm512_reduce_add_epi32(qb);
  return amax;
}

SPECDEC_TARGET_AVX2 inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

SPECDEC_TARGET_AVX2 inline float quantize_block32_avx2(const float* x, int8_t* low, int8_t* high,
                                                       int32_t half_sum[2]) {
  __m256 v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude), _mm256_and_ps(v[1], magnitude)),
                           _mm256_max_ps(_mm256_and_ps(v[2], magnitude), _mm256_and_ps(v[3], magnitude)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[i] = _mm256_cvtps_epi32(_mm256_max_ps(lo, _mm256_min_ps(hi, r)));
  }
  // Packs work within 128-bit lanes; the permutes put the values back in order (|q| <= 127:
  // the saturating packs are exact).
  const __m256i w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
  const __m256i w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
  const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm256_castsi256_si128(bytes));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(high), _mm256_extracti128_si256(bytes, 1));
  half_sum[0] = hsum_epi32(_mm256_add_epi32(q[0], q[1]));
  half_sum[1] = hsum_epi32(_mm256_add_epi32(q[2], q[3]));
  return amax;
}
#endif

// Quantizes row `m` of x (K values): per block of 32 values (the last one may be shorter),
// scale = amax / 127 and q = round-half-even(x * (127 / amax)), all in float32 (the
// reference, specdec_kernels.reference.quantize_activations, does the same operations).
template <typename T>
void quantize_row(const T* x, int64_t m, int64_t group, QuantizedRows& out, int level) {
  const int64_t K = out.K;
  const int cv = chunk_values(out.int4);
  int8_t* q = out.q.data() + m * out.padded;
  float* lanes = out.lane_scale.data() + m * (out.padded / cv) * kLanes;
  float* sums = out.group_sum.data() + m * out.groups;
  for (int64_t g = 0; g < out.groups; ++g) sums[g] = 0.0f;
  float block_values[kXBlock];
  for (int64_t b0 = 0; b0 < K; b0 += kXBlock) {
    const int64_t len = std::min<int64_t>(kXBlock, K - b0);
    // Where the block's values go: int8 in place; int4 low partners (values 0..15 of the
    // block) at chunk * 128 + block * 16, high partners 64 further.
    const int64_t block_in_chunk = (b0 % 128) / 32;
    int8_t* low = q + (out.int4 ? (b0 / 128) * 128 + block_in_chunk * 16 : b0);
    int8_t* high = out.int4 ? low + 64 : low + 16;
    float scale;
    if (len == kXBlock) {
      for (int i = 0; i < kXBlock; ++i) block_values[i] = static_cast<float>(x[b0 + i]);
      int32_t half_sum[2];
      float amax;
#if SPECDEC_X86
      if (level >= simd::kAvx512) {
        amax = quantize_block32_avx512(block_values, low, high, half_sum);
      } else if (level >= simd::kAvx2) {
        amax = quantize_block32_avx2(block_values, low, high, half_sum);
      } else {
        amax = quantize_block32_portable(block_values, low, high, half_sum);
      }
#else
      (void)level;
      amax = quantize_block32_portable(block_values, low, high, half_sum);
#endif
      scale = amax / 127.0f;
      // Integer sums of this block's values per weight group it touches (a group of 16
      // holds one half), then scaled once: the order of the scalar loop below.
      if (group >= kXBlock) {
        sums[b0 / group] += static_cast<float>(half_sum[0] + half_sum[1]) * scale;
      } else {
        sums[b0 / group] += static_cast<float>(half_sum[0]) * scale;
        sums[b0 / group + 1] += static_cast<float>(half_sum[1]) * scale;
      }
    } else {  // the short last block
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[b0 + i])));
      scale = amax / 127.0f;
      const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t part = 0;
      int64_t part_group = b0 / group;
      for (int64_t i = 0; i < len; ++i) {
        const int64_t k = b0 + i;
        const float v = std::nearbyint(static_cast<float>(x[k]) * inverse);
        const int8_t qv = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v)));
        (i < 16 ? low[i] : high[i - 16]) = qv;
        if (k / group != part_group) {
          sums[part_group] += static_cast<float>(part) * scale;
          part = 0;
          part_group = k / group;
        }
        part += qv;
      }
      sums[part_group] += static_cast<float>(part) * scale;
    }
    // Lane scales: int8 lane l of a chunk covers values 4l..4l+3 (block l / 8 of the chunk);
    // int4 lane l covers block l / 4 of the chunk (low and high partners alike).
    const int64_t block = b0 / kXBlock;
    if (out.int4) {
      for (int l = 0; l < 4; ++l) lanes[(block / 4) * kLanes + (block % 4) * 4 + l] = scale;
    } else {
      for (int l = 0; l < 8; ++l) lanes[(block / 2) * kLanes + (block % 2) * 8 + l] = scale;
    }
  }
}

template <typename T>
QuantizedRows quantize_rows(const T* x, int64_t rows, int64_t K, int64_t group, bool int4,
                            int level) {
  QuantizedRows out;
  out.rows = rows;
  out.K = K;
  out.int4 = int4;
  const int cv = chunk_values(int4);
  out.padded = (K + cv - 1) / cv * cv;
  out.groups = K / group;
  out.q.assign(rows * out.padded, 0);
  out.lane_scale.assign(rows * (out.padded / cv) * kLanes, 0.0f);
  out.group_sum.assign(rows * out.groups, 0.0f);
  for (int64_t m = 0; m < rows; ++m) quantize_row(x + m * K, m, group, out, level);
  return out;
}

// The weights of one call.
template <typename S>
struct QuantizedWeights {
  const uint8_t* q;  // [N, row_bytes]
  const S* scale;    // [N, groups]
  const S* min;      // [N, groups] or nullptr
  int64_t row_bytes, groups, group;
};

inline float to_float(float v) { return v; }
inline float to_float(c10::Half v) { return static_cast<float>(v); }

// One tile: rows m0 .. m0 + MR - 1 of x against weight rows n0 .. n0 + NR - 1; out rows ldo
// apart (float32 results, written before the caller converts).
template <typename S>
using QTileFn = void (*)(const QuantizedRows& x, int64_t m0, const QuantizedWeights<S>& w,
                         int64_t n0, float* out, int64_t ldo);

// The min term of one (row, weight row) on the portable path: sum over groups of
// min[g] * group_sum[g], in a fixed order (8 partial sums by group mod 8, then a fixed tree).
template <typename S>
float min_term_portable(const S* min, const float* group_sum, int64_t groups) {
  float part[8] = {};
  for (int64_t g = 0; g < groups; ++g) part[g % 8] += to_float(min[g]) * group_sum[g];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// ----------------------------------------------------------------------------- portable

// Signed value v of weight row `w` (row_bytes bytes) at K index k.
inline int32_t weight_value(const uint8_t* w, int64_t k, bool int4) {
  if (!int4) return static_cast<int8_t>(w[k]);
  const uint8_t byte = w[(k / 32) * 16 + (k % 16)];
  return (k % 32) < 16 ? (byte & 0x0F) : (byte >> 4);
}

// x value of quantized row q (kernel order) at K index k.
inline int32_t x_value(const int8_t* q, int64_t k, bool int4) {
  if (!int4) return q[k];
  const int64_t chunk = k / 128, in_chunk = k % 128, block = in_chunk / 32, j = in_chunk % 32;
  return q[chunk * 128 + (j < 16 ? 0 : 64) + block * 16 + (j % 16)];
}

// Same order of float operations as the vector paths lane by lane is not required (results
// may differ between instruction sets); this one sums per 4-value lane like them.
template <typename S, int MR, int NR>
void qtile_portable(const QuantizedRows& x, int64_t m0, const QuantizedWeights<S>& w, int64_t n0,
                    float* out, int64_t ldo) {
  const bool int4 = x.int4;
  const int cv = chunk_values(int4);
  for (int mi = 0; mi < MR; ++mi) {
    const int64_t m = m0 + mi;
    const int8_t* q = x.q_row(m);
    const float* lanes = x.lane_scale_row(m);
    for (int ni = 0; ni < NR; ++ni) {
      const int64_t n = n0 + ni;
      const uint8_t* wr = w.q + n * w.row_bytes;
      const S* scale = w.scale + n * w.groups;
      float acc[kLanes] = {};
      for (int64_t c = 0; c * cv < x.K; ++c) {
        for (int l = 0; l < kLanes; ++l) {
          // The 4 values lane l covers: int8 values 4l..4l+3 of the chunk; int4 block l / 4,
          // low partners 4(l%4)..+3 and their high partners.
          int32_t isum = 0;
          int64_t first;
          if (!int4) {
            first = c * cv + 4 * l;
            for (int i = 0; i < 4; ++i)
              if (first + i < x.K) isum += weight_value(wr, first + i, false) * x_value(q, first + i, false);
          } else {
            first = c * cv + 32 * (l / 4) + 4 * (l % 4);
            for (int i = 0; i < 4; ++i) {
              const int64_t k = first + i;
              if (k < x.K) {
                isum += weight_value(wr, k, true) * x_value(q, k, true);
                isum += weight_value(wr, k + 16, true) * x_value(q, k + 16, true);
              }
            }
          }
          if (first >= x.K) continue;
          const float ws = to_float(scale[first / w.group]);
          acc[l] += static_cast<float>(isum) * (ws * lanes[c * kLanes + l]);
        }
      }
      // The reduction tree of simd::reduce_add (16 lanes): halves, quarters, pairs.
      float s8[8], s4[4];
      for (int i = 0; i < 8; ++i) s8[i] = acc[i] + acc[i + 8];
      for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
      float sum = (s4[0] + s4[2]) + (s4[1] + s4[3]);
      if (w.min != nullptr) sum += min_term_portable(w.min + n * w.groups, x.group_sum_row(m), w.groups);
      out[mi * ldo + ni] = sum;
    }
  }
}

#if SPECDEC_X86
#define SPECDEC_TARGET_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

// ----------------------------------------------------------------------------- AVX-512

SPECDEC_TARGET_AVX512 inline __m512 load_mins16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
SPECDEC_TARGET_AVX512 inline __m512 load_mins16(const c10::Half* p, __mmask16 mask) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}

// The min term's lanes added to an output's accumulator (lane l gets min[g] * group_sum[g] for
// groups l, l + 16, ...): one reduction per output for both sums.
template <typename S>
SPECDEC_TARGET_AVX512 inline __m512 add_min_lanes(__m512 acc, const S* min, const float* group_sum,
                                                  int64_t groups) {
  for (int64_t g = 0; g < groups; g += 16) {
    const int64_t left = groups - g;
    const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
    acc = _mm512_fmadd_ps(load_mins16(min + g, mask), _mm512_maskz_loadu_ps(mask, group_sum + g), acc);
  }
  return acc;
}

// Up to 4 group scales starting at p (count of them valid), as 4 floats.
SPECDEC_TARGET_AVX512 inline __m128 load_scales4(const float* p, int count) {
  return _mm_maskz_loadu_ps(static_cast<__mmask8>((1u << count) - 1u), p);
}
SPECDEC_TARGET_AVX512 inline __m128 load_scales4(const c10::Half* p, int count) {
  return _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << count) - 1u), p));
}

// Lane -> index of its group among the (up to 4) groups a chunk touches.
struct LaneGroups {
  __m512i index;
  int per_chunk;  // groups starting in one chunk (1 when a group spans chunks)
};

SPECDEC_TARGET_AVX512 inline LaneGroups lane_groups(int64_t group, bool int4) {
  alignas(64) int32_t idx[kLanes];
  const int cv = chunk_values(int4);
  for (int l = 0; l < kLanes; ++l) {
    const int offset = int4 ? 32 * (l / 4) : 4 * l;  // first K value of the lane in its chunk
    idx[l] = group <= cv ? static_cast<int32_t>(offset / group) : 0;
  }
  return {_mm512_load_si512(idx), group <= cv ? static_cast<int>(cv / group) : 1};
}

// Integer sums of the 16 lanes: sum over the lane's 4 bytes of w * x (w unsigned, x signed).
template <bool kVnni>
SPECDEC_TARGET_AVX512VNNI inline __m512i dot_u8s8(__m512i acc, __m512i w, __m512i x) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(acc, w, x);
  } else {  // pairs into int16 (|w| <= 128, |x| <= 127: no saturation), then pairs of those
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
  }
}

template <typename S, int MR, int NR, bool kInt4, bool kVnni>
SPECDEC_TARGET_AVX512VNNI void qtile_avx512(const QuantizedRows& x, int64_t m0,
                                            const QuantizedWeights<S>& w, int64_t n0, float* out,
                                            int64_t ldo) {
  constexpr int cv = chunk_values(kInt4);
  const LaneGroups lg = lane_groups(w.group, kInt4);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  const int64_t chunks = x.padded / cv;
  // Row pointers and the group shift out of the loop: QuantizedRows' accessors divide by a
  // run-time chunk size, and an integer division per (chunk, weight row) made this loop three
  // times slower than its vector work.
  const int8_t* xrow[MR];
  const float* xlanes[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) xrow[m] = x.q_row(m0 + m), xlanes[m] = x.lane_scale_row(m0 + m);
  // Weight and scale rows out of the loop too (the struct's fields were reloaded per row).
  const int64_t row_bytes = w.row_bytes, groups = w.groups;
  const uint8_t* wrow[NR];
  const S* srow[NR];
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n) wrow[n] = w.q + (n0 + n) * row_bytes, srow[n] = w.scale + (n0 + n) * groups;
  const int group_shift = __builtin_ctzll(static_cast<uint64_t>(w.group));  // a power of two
  const int64_t ahead = kPrefetchTiles * NR * row_bytes;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t byte0 = c * kChunkBytes;
    const int64_t left = row_bytes - byte0;
    const __mmask64 mask = left >= 64 ? ~__mmask64(0) : ((__mmask64(1) << left) - 1);
    const int64_t g0 = (c * cv) >> group_shift;
    const int count = static_cast<int>(std::min<int64_t>(lg.per_chunk, groups - g0));
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      const uint8_t* wr = wrow[n] + byte0;
      __builtin_prefetch(wr + ahead, 0, 3);
      if constexpr (MR == 1) __builtin_prefetch(wr + kFarPrefetchTiles * ahead, 0, 2);
      const __m512i raw = _mm512_maskz_loadu_epi8(mask, wr);
      const __m512 wscale =
          _mm512_permutexvar_ps(lg.index, _mm512_castps128_ps512(load_scales4(srow[n] + g0, count)));
      __m512i lo, hi;
      __mmask64 negative = 0;
      if constexpr (kInt4) {
        lo = _mm512_and_si512(raw, low4);
        hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      } else {  // |w| as unsigned bytes; x takes w's sign
        lo = _mm512_abs_epi8(raw);
        negative = _mm512_movepi8_mask(raw);
        hi = lo;
      }
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = xrow[m] + c * cv;
        __m512i isum;
        if constexpr (kInt4) {
          isum = dot_u8s8<kVnni>(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
          isum = dot_u8s8<kVnni>(isum, hi, _mm512_loadu_si512(xq + 64));
        } else {
          const __m512i xv = _mm512_loadu_si512(xq);
          const __m512i signed_x = _mm512_mask_sub_epi8(xv, negative, _mm512_setzero_si512(), xv);
          isum = dot_u8s8<kVnni>(_mm512_setzero_si512(), lo, signed_x);
        }
        const __m512 xscale = _mm512_loadu_ps(xlanes[m] + c * kLanes);
        acc[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(wscale, xscale), acc[m][n]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    if (w.min != nullptr) {
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n)
        acc[m][n] = add_min_lanes(acc[m][n], w.min + (n0 + n) * groups, x.group_sum_row(m0 + m), groups);
    }
    simd::reduce_add_each<NR>(acc[m], out + m * ldo);
  }
}

// ----------------------------------------------------------------------------- AVX2

// p[i] as a float where i < rest, else 0.
SPECDEC_TARGET_AVX2 inline float tail_value(const float* p, int i, int64_t rest) {
  return i < rest ? p[i] : 0.0f;
}
SPECDEC_TARGET_AVX2 inline float tail_value(const c10::Half* p, int i, int64_t rest) {
  return i < rest ? _cvtsh_ss(p[i].x) : 0.0f;
}

// The min term's lanes added to an output's accumulator, 8 groups at a time (lane l gets
// groups l, l + 8, ...; the tail zero-filled).
template <typename S>
SPECDEC_TARGET_AVX2 __m256 add_min_lanes(__m256 acc, const S* min, const float* group_sum, int64_t groups) {
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 mv;
    if constexpr (std::is_same_v<S, float>) {
      mv = _mm256_loadu_ps(min + g);
    } else {
      mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(min + g)));
    }
    acc = _mm256_fmadd_ps(mv, _mm256_loadu_ps(group_sum + g), acc);
  }
  if (g < groups) {
    // The tail built in registers: through a stack buffer (stores, then a wide load that
    // cannot be forwarded) it cost 40% of a 576-wide row.
    const int64_t rest = groups - g;
    const S* m = min + g;
    const float* s = group_sum + g;
    const __m256 mv = _mm256_setr_ps(tail_value(m, 0, rest), tail_value(m, 1, rest), tail_value(m, 2, rest),
                                     tail_value(m, 3, rest), tail_value(m, 4, rest), tail_value(m, 5, rest),
                                     tail_value(m, 6, rest), 0.0f);
    const __m256 sv = _mm256_setr_ps(tail_value(s, 0, rest), tail_value(s, 1, rest), tail_value(s, 2, rest),
                                     tail_value(s, 3, rest), tail_value(s, 4, rest), tail_value(s, 5, rest),
                                     tail_value(s, 6, rest), 0.0f);
    acc = _mm256_fmadd_ps(mv, sv, acc);
  }
  return acc;
}

SPECDEC_TARGET_AVX2 inline __m128 load_scales2(const float* p, int count) {
  return count >= 2 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)))
                    : _mm_load_ss(p);
}
SPECDEC_TARGET_AVX2 inline __m128 load_scales2(const c10::Half* p, int count) {
  const uint32_t bits = static_cast<uint32_t>(p[0].x) | (count >= 2 ? static_cast<uint32_t>(p[1].x) << 16 : 0u);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
}

// 32 bytes of a weight row; fewer than 32 left: zero-filled. A row holds a multiple of 16
// bytes (groups of >= 16 int8 or >= 32 int4 values), so the tail is whole 4-byte lanes: a
// masked load, no call (a byte loop here became a call to memcpy: see qtile_avx2).
SPECDEC_TARGET_AVX2 inline __m256i load32(const uint8_t* p, int64_t left) {
  if (left >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left / 4)), lane);
  return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), mask);
}

// With kVnni the integer sums are AVX-VNNI's vpdpbusd (VEX, 256-bit: Intel cores from Alder
// Lake and Sapphire Rapids, AMD from Zen 5) instead of vpmaddubsw + vpmaddwd: the same exact
// int32 sums (the int16 pairs never saturate), hence the same bits. The attribute admits
// AVX-VNNI in both variants; only the kVnni one is dispatched to on CPUs that have it, and the
// other holds no VNNI instruction (checked with objdump when this was written: GCC 12 does
// not form vpdpbusd from these intrinsics).
#define SPECDEC_TARGET_AVX2_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

// A half chunk (32 weight bytes) at a time: 8 lanes of 4 values (int8: values 4l..4l+3 of
// the 32; int4: the half's 2 blocks, lanes 0-3 the first). The lane scales and lane order are
// those of the first or second half of the AVX-512 chunk.
//
// Everything the loop reads is hoisted into locals (row pointers, sizes) and nothing in it
// calls a function: a byte loop for a short row's tail had become a call to memcpy, and with a
// call in the loop GCC kept every accumulator on the stack (measured with bench/kernel_ab on
// the Intel Xeon, AVX2 path: a step's quantized linears 8-13% faster at M = 1, 4-7% at M = 4-16).
// A 4 x 4 tile still has more accumulators and operands than AVX2's 16 registers; tiles of 8
// accumulators (4 x 2) measured 4-12% slower than spilling, so the tile shapes are those of the
// AVX-512 tiles.
template <typename S, int MR, int NR, bool kInt4, bool kVnni>
SPECDEC_TARGET_AVX2_VNNI void qtile_avx2(const QuantizedRows& x, int64_t m0,
                                         const QuantizedWeights<S>& w, int64_t n0, float* out,
                                         int64_t ldo) {
  constexpr int cv = chunk_values(kInt4);
  constexpr int half_values = cv / 2;
  const int64_t row_bytes = w.row_bytes, groups = w.groups, group = w.group;
  // Lane -> index of its group among the (up to 2) groups a half touches.
  auto lane_index = [&](int l) {
    const int offset = kInt4 ? 32 * (l / 4) : 4 * l;
    return group <= half_values ? static_cast<int>(offset / group) : 0;
  };
  const __m256i lane_group = _mm256_setr_epi32(lane_index(0), lane_index(1), lane_index(2), lane_index(3),
                                               lane_index(4), lane_index(5), lane_index(6), lane_index(7));
  const int per_half = group <= half_values ? static_cast<int>(half_values / group) : 1;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  const int64_t halves = x.padded / half_values;
  const int8_t* xrow[MR];  // out of the loop, as in qtile_avx512
  const float* xlanes[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) xrow[m] = x.q_row(m0 + m), xlanes[m] = x.lane_scale_row(m0 + m);
  const uint8_t* wrow[NR];
  const S* srow[NR];
#pragma GCC unroll 8
  for (int n = 0; n < NR; ++n) wrow[n] = w.q + (n0 + n) * row_bytes, srow[n] = w.scale + (n0 + n) * groups;
  const int group_shift = __builtin_ctzll(static_cast<uint64_t>(group));
  const int64_t ahead = kPrefetchTiles * NR * row_bytes;
  for (int64_t h = 0; h < halves; ++h) {
    const int64_t byte0 = h * 32;
    if (byte0 >= row_bytes) break;  // padding only: zero products
    const int64_t g0 = (h * half_values) >> group_shift;
    const int count = static_cast<int>(std::min<int64_t>(per_half, groups - g0));
    // Where this half's x bytes and lane scales sit in the AVX-512 chunk layout.
    const int64_t xoff = (h / 2) * cv + (h % 2) * 32;
    const int64_t loff = (h / 2) * kLanes + (h % 2) * 8;
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      const uint8_t* wr = wrow[n] + byte0;
      if (h % 2 == 0) {  // once per 64-byte line
        __builtin_prefetch(wr + ahead, 0, 3);
        if constexpr (MR == 1) __builtin_prefetch(wr + kFarPrefetchTiles * ahead, 0, 2);
      }
      const __m256i raw = load32(wr, row_bytes - byte0);
      const __m256 wscale = _mm256_permutevar8x32_ps(
          _mm256_castps128_ps256(load_scales2(srow[n] + g0, count)), lane_group);
      __m256i lo, hi;
      if constexpr (kInt4) {
        lo = _mm256_and_si256(raw, low4);
        hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      } else {
        lo = _mm256_abs_epi8(raw);
        hi = raw;  // the sign source
      }
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = xrow[m] + xoff;
        __m256i isum;
        if constexpr (kInt4) {
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64));
          if constexpr (kVnni) {
            isum = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xl),
                                           hi, xh);
          } else {  // 15 * 127 * 2 per pair, twice: far from int16 saturation.
            isum = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)), ones);
          }
        } else {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
          const __m256i xs = _mm256_sign_epi8(xv, hi);
          if constexpr (kVnni) {
            isum = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xs);
          } else {
            isum = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xs), ones);
          }
        }
        const __m256 xscale = _mm256_loadu_ps(xlanes[m] + loff);
        acc[m][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(wscale, xscale), acc[m][n]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    if (w.min != nullptr) {
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n)
        acc[m][n] = add_min_lanes(acc[m][n], w.min + (n0 + n) * groups, x.group_sum_row(m0 + m), groups);
    }
    simd::reduce_add_each<NR>(acc[m], out + m * ldo);
  }
}
#endif  // SPECDEC_X86

// ----------------------------------------------------------------------------- tile tables

constexpr int kMaxRowTile = 4;
constexpr int kWeightTile = 4;
constexpr int kSingleRowWeightTile = 8;

template <typename S>
struct QTileTable {
  QTileFn<S> table[kMaxRowTile][kWeightTile];
  QTileFn<S> single[kSingleRowWeightTile];
};

template <typename S, template <int, int> class Kernel, int MR, int... NR>
void fill_qrow(QTileFn<S>* row, std::integer_sequence<int, NR...>) {
  ((row[NR] = Kernel<MR, NR + 1>::fn), ...);
}

template <typename S, template <int, int> class Kernel, int... MR>
void fill_qtable(QTileTable<S>& t, std::integer_sequence<int, MR...>) {
  (fill_qrow<S, Kernel, MR + 1>(t.table[MR], std::make_integer_sequence<int, kWeightTile>{}), ...);
}

// Kernel<MR, NR>::fn for every tile shape.
template <typename S, template <int, int> class Kernel>
QTileTable<S> make_qtable() {
  QTileTable<S> t{};
  fill_qtable<S, Kernel>(t, std::make_integer_sequence<int, kMaxRowTile>{});
  fill_qrow<S, Kernel, 1>(t.single, std::make_integer_sequence<int, kSingleRowWeightTile>{});
  return t;
}

template <typename S, bool kInt4>
struct PortableQ {
  template <int MR, int NR>
  struct K {
    static constexpr QTileFn<S> fn = &qtile_portable<S, MR, NR>;
  };
};

#if SPECDEC_X86
template <typename S, bool kInt4, bool kVnni>
struct Avx512Q {
  template <int MR, int NR>
  struct K {
    static constexpr QTileFn<S> fn = &qtile_avx512<S, MR, NR, kInt4, kVnni>;
  };
};

template <typename S, bool kInt4, bool kVnni>
struct Avx2Q {
  template <int MR, int NR>
  struct K {
    static constexpr QTileFn<S> fn = &qtile_avx2<S, MR, NR, kInt4, kVnni>;
  };
};

// Whether the CPU has `feature` ("avx512vnni", "avxvnni") and SPECDEC_CPU_VNNI is not "0" (the
// VNNI tiles give the other tiles' bits; the switch lets a test compare them).
inline bool vnni_allowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("SPECDEC_CPU_VNNI");
    return env == nullptr || std::string(env) != "0";
  }();
  return allowed;
}

inline bool has_avx512_vnni() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return vnni_allowed() && static_cast<bool>(__builtin_cpu_supports("avx512vnni"));
  }();
  return vnni;
}

inline bool has_avx_vnni() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return vnni_allowed() && static_cast<bool>(__builtin_cpu_supports("avxvnni"));
  }();
  return vnni;
}
#endif

// The tiles of the best instruction set allowed (VNNI where the CPU has it: the same bits).
template <typename S, bool kInt4>
const QTileTable<S>& qtiles_for(int level) {
  static const QTileTable<S> portable = make_qtable<S, PortableQ<S, kInt4>::template K>();
#if SPECDEC_X86
  static const QTileTable<S> avx2 = make_qtable<S, Avx2Q<S, kInt4, false>::template K>();
  static const QTileTable<S> avx2_vnni = make_qtable<S, Avx2Q<S, kInt4, true>::template K>();
  static const QTileTable<S> avx512 = make_qtable<S, Avx512Q<S, kInt4, false>::template K>();
  static const QTileTable<S> avx512_vnni = make_qtable<S, Avx512Q<S, kInt4, true>::template K>();
  if (level >= simd::kAvx512) return has_avx512_vnni() ? avx512_vnni : avx512;
  if (level >= simd::kAvx2) return has_avx_vnni() ? avx2_vnni : avx2;
#endif
  (void)level;
  return portable;
}

}  // namespace qdot
}  // namespace specdec
