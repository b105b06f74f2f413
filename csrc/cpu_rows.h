// Vectorised passes over one row of logits for the CPU sampling and verification kernels
// (csrc/sampling_cpu.h): the validity/argmax scan, the float32 copy, the exp-sum and the
// candidate gathering of the top-k / top-p selection. AVX-512 and AVX2, with a portable fallback.
//
// Sums are taken per chunk of kChunk tokens (lane partials in double, combined in a fixed
// order) and the chunk sums are added in chunk order, so a row's sums do not depend on how its
// chunks are spread over threads. They are double sums of float32 terms, as on CUDA and in the
// reference; only the order of additions differs between the three.
//
// Passes that compute raw weights over a row take the row's bf16 weight table (core/sampling.h;
// nullptr for other rows): a lookup replaces the exp where the table holds the logit's bits,
// with the same result bits.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu_simd.h"
#include "core/sampling.h"

namespace specdec {
namespace rows {

// Tokens per chunk of a row: the unit of the chunk sums and of splitting a row over threads.
constexpr int64_t kChunk = 4096;

inline int64_t num_chunks(int64_t vocab) { return (vocab + kChunk - 1) / kChunk; }

// What one pass over a row (or part of it) finds.
struct Scan {
  bool bad = false;     // some NaN or +Inf
  bool finite = false;  // some finite value
  float max = -std::numeric_limits<float>::infinity();
  int64_t argmax = 0;   // first index of max (meaningless if !finite)

  // Merges the scan of a later part of the row.
  void merge(const Scan& later) {
    bad = bad || later.bad;
    finite = finite || later.finite;
    if (later.max > max) {
      max = later.max;
      argmax = later.argmax;
    }
  }
  bool valid() const { return !bad && finite; }
};

// ----------------------------------------------------------------------------- portable

template <typename T>
Scan scan_portable(const T* x, int64_t begin, int64_t end) {
  Scan s;
  s.argmax = begin;
  for (int64_t i = begin; i < end; ++i) {
    const float v = static_cast<float>(x[i]);
    s.bad = s.bad || is_nan_or_pos_inf(v);
    s.finite = s.finite || !is_neg_inf(v);
    if (v > s.max) {
      s.max = v;
      s.argmax = i;
    }
  }
  return s;
}

// Tokens per block of the block maxima (kChunk is a multiple).
constexpr int64_t kBlock = 256;

// Copies [begin, end) as float32 while scanning it; block_max[i] gets the largest value of
// block i (begin is a multiple of kBlock).
template <typename T>
Scan copy_scan_portable(const T* x, float* out, int64_t begin, int64_t end, float* block_max) {
  for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(x[i]);
  for (int64_t b = begin; b < end; b += kBlock)
    block_max[b / kBlock] = scan_portable(out, b, std::min(end, b + kBlock)).max;
  return scan_portable(out, begin, end);
}

// The vector scans go by blocks of kBlock values and keep, per block, only its maximum and a
// NaN flag (3 vector operations per value vector, where tracking each lane's argmax took 10);
// this finds the first index of the row's maximum in `best_block`, the first block that holds
// it. A row with NaN or +Inf (an error) is scanned again by the portable code for its exact
// flags.
template <typename T>
Scan finish_block_scan(const T* x, int64_t begin, int64_t end, float best, int64_t best_block,
                       bool nan) {
  if (nan || best > kFloatMax) return scan_portable(x, begin, end);
  Scan s;
  s.argmax = begin;
  s.finite = best >= -kFloatMax;
  if (!s.finite) return s;  // every value -inf
  const int64_t block_end = std::min(end, best_block + kBlock);
  for (int64_t i = best_block; i < block_end; ++i) {
    const float v = static_cast<float>(x[i]);
    if (v == best) {
      s.argmax = i;
      s.max = v;
      break;
    }
  }
  return s;
}

// The bf16 bits of a float32 that holds a widened bf16 value.
inline uint32_t bf16_bits_of(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits >> 16;
}

// specdec_exp(a) for a = (l - M) * invT: from the row's weight table when it holds l's bits.
inline float raw_weight_portable(float l, float a, const float* table) {
  if (table != nullptr) {
    const int k = weight_table_index(bf16_bits_of(l));
    if (k >= 0) return table[k];
  }
  return specdec_exp(a);
}

inline void weight_table_portable(float max_logit, float inv_temperature, float* table) {
  for (int k = 0; k < 2 * kWeightTableSpan; ++k) {
    const uint32_t bits = weight_table_bits(k) << 16;
    float l;
    std::memcpy(&l, &bits, sizeof(l));
    table[k] = specdec_exp(mul_rn(sub_rn(l, max_logit), inv_temperature));
  }
}

// Sum of the weights w = specdec_exp((l - M) * invT) >= min_weight over [begin, end); with
// `entropy`, also the sum of w * (l - M) * invT (typical acceptance). Eight double partials,
// combined in a fixed order.
inline void exp_sum_portable(const float* l, int64_t begin, int64_t end, float max_logit,
                             float inv_temperature, float min_weight, const float* table,
                             double* sum, double* entropy) {
  double part[8] = {}, ent[8] = {};
  for (int64_t i = begin; i < end; ++i) {
    const float a = mul_rn(sub_rn(l[i], max_logit), inv_temperature);
    const float raw = raw_weight_portable(l[i], a, table);
    const float w = raw >= min_weight ? raw : 0.0f;
    part[(i - begin) & 7] += w;
    if (entropy != nullptr && w > 0.0f) ent[(i - begin) & 7] += mul_rn(w, a);
  }
  *sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  if (entropy != nullptr)
    *entropy = ((ent[0] + ent[1]) + (ent[2] + ent[3])) + ((ent[4] + ent[5]) + (ent[6] + ent[7]));
}

inline void write_probs_portable(const float* l, int64_t begin, int64_t end, const RowFilter& f,
                                 const float* table, float* out) {
  for (int64_t x = begin; x < end; ++x) {
    const float a = mul_rn(sub_rn(l[x], f.max_logit), f.inv_temperature);
    out[x] = div_rn(f.kept_weight(l[x], raw_weight_portable(l[x], a, table)), f.total);
  }
}

inline int64_t gather_portable(const float* l, int64_t begin, int64_t end, float floor_value,
                               int32_t* out) {
  int64_t n = 0;
  for (int64_t i = begin; i < end; ++i)
    if (l[i] >= floor_value) out[n++] = static_cast<int32_t>(i);
  return n;
}

inline int64_t count_portable(const float* l, int64_t begin, int64_t end, float floor_value) {
  int64_t n = 0;
  for (int64_t i = begin; i < end; ++i) n += l[i] >= floor_value;
  return n;
}

#if SPECDEC_X86
// ----------------------------------------------------------------------------- AVX-512

// 16 values as float32 (widened exactly); masked-off lanes read as `fill`.
SPECDEC_TARGET_AVX512 inline __m512 load_f32(const float* p, __mmask16 m, __m512 fill) {
  return _mm512_mask_loadu_ps(fill, m, p);
}
SPECDEC_TARGET_AVX512 inline __m512 load_f32(const c10::BFloat16* p, __mmask16 m, __m512 fill) {
  return _mm512_mask_blend_ps(m, fill, simd::bf16_to_f32(_mm256_maskz_loadu_epi16(m, p)));
}
SPECDEC_TARGET_AVX512 inline __m512 load_f32(const c10::Half* p, __mmask16 m, __m512 fill) {
  return _mm512_mask_blend_ps(m, fill, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)));
}

SPECDEC_TARGET_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

// The block scan (finish_block_scan) on 16 lanes; `out` (a float32 copy of the row) and
// `block_max` (each block's maximum; begin a multiple of kBlock) may be nullptr.
template <typename T>
SPECDEC_TARGET_AVX512 Scan block_scan_avx512(const T* x, float* out, int64_t begin, int64_t end,
                                             float* block_max) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_block = begin;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t block_end = std::min(end, b + kBlock);
    __m512 lanes = neg_inf;
    for (int64_t i = b; i < block_end; i += 16) {
      const __mmask16 m = tail_mask(block_end - i);
      const __m512 v = load_f32(x + i, m, neg_inf);
      if (out != nullptr) _mm512_mask_storeu_ps(out + i, m, v);
      lanes = _mm512_max_ps(v, lanes);  // a NaN lane leaves the maximum as it was
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    const float block = _mm512_reduce_max_ps(lanes);
    if (block_max != nullptr) block_max[b / kBlock] = block;
    if (block > best) {
      best = block;
      best_block = b;
    }
  }
  return finish_block_scan(x, begin, end, best, best_block, nan != 0);
}

template <typename T>
SPECDEC_TARGET_AVX512 Scan scan_avx512(const T* x, int64_t begin, int64_t end) {
  return block_scan_avx512(x, nullptr, begin, end, nullptr);
}

// scan_avx512 that also copies the row to `out` as float32 and writes the max of each
// kBlock-long block to `block_max`.
template <typename T>
SPECDEC_TARGET_AVX512 Scan copy_scan_avx512(const T* x, float* out, int64_t begin, int64_t end,
                                            float* block_max) {
  return block_scan_avx512(x, out, begin, end, block_max);
}

// Raw weights of 16 lanes given a = (v - M) * invT: looked up in the row's weight table
// where it holds v's bf16 bits (table non-null), computed elsewhere; the same bits either way.
SPECDEC_TARGET_AVX512 inline __m512 raw_weights16(__m512 v, __m512 a, const float* table) {
  if (table == nullptr) return simd::exp16(a);
  const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
  const __m512i d = _mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF)),
                                     _mm512_set1_epi32(kWeightTableLow));
  const __mmask16 held = _mm512_cmplt_epu32_mask(d, _mm512_set1_epi32(kWeightTableSpan));
  const __m512i index =
      _mm512_add_epi32(d, _mm512_slli_epi32(_mm512_srli_epi32(bits, 15), kWeightTableSignShift));
  const __m512 looked = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), held, index, table, 4);
  if (held == 0xFFFF) return looked;
  return _mm512_mask_blend_ps(held, simd::exp16(a), looked);
}

SPECDEC_TARGET_AVX512 inline void weight_table_avx512(float max_logit, float inv_temperature,
                                                      float* table) {
  const __m512 m = _mm512_set1_ps(max_logit);
  const __m512 inv_t = _mm512_set1_ps(inv_temperature);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int k = 0; k < 2 * kWeightTableSpan; k += 16) {  // a half is a multiple of 16
    const __m512i bits = _mm512_add_epi32(_mm512_set1_epi32(weight_table_bits(k)), lane);
    const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
    _mm512_storeu_ps(table + k, simd::exp16(_mm512_mul_ps(_mm512_sub_ps(v, m), inv_t)));
  }
}

// Adds the 16 float lanes to two double accumulators (8 lanes each).
SPECDEC_TARGET_AVX512 inline void add_wide(__m512 v, __m512d& lo, __m512d& hi) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
}

SPECDEC_TARGET_AVX512 inline double finish_wide(__m512d lo, __m512d hi) {
  const __m512d s = _mm512_add_pd(lo, hi);
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

SPECDEC_TARGET_AVX512 inline void exp_sum_avx512(const float* l, int64_t begin, int64_t end,
                                                 float max_logit, float inv_temperature,
                                                 float min_weight, const float* table,
                                                 double* sum, double* entropy) {
  const __m512 floor_w = _mm512_set1_ps(min_weight);
  const __m512 m = _mm512_set1_ps(max_logit);
  const __m512 inv_t = _mm512_set1_ps(inv_temperature);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512d s_lo = _mm512_setzero_pd(), s_hi = _mm512_setzero_pd();
  __m512d e_lo = _mm512_setzero_pd(), e_hi = _mm512_setzero_pd();
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 k = tail_mask(end - i);
    const __m512 v = _mm512_mask_loadu_ps(neg_inf, k, l + i);
    const __m512 a = _mm512_mul_ps(_mm512_sub_ps(v, m), inv_t);
    const __m512 raw = raw_weights16(v, a, table);  // 0 on masked-off lanes (-inf)
    const __m512 w = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(raw, floor_w, _CMP_GE_OQ), raw);
    add_wide(w, s_lo, s_hi);
    if (entropy != nullptr) {
      const __mmask16 positive = _mm512_cmp_ps_mask(w, _mm512_setzero_ps(), _CMP_GT_OQ);
      add_wide(_mm512_maskz_mul_ps(positive, w, a), e_lo, e_hi);
    }
  }
  *sum = finish_wide(s_lo, s_hi);
  if (entropy != nullptr) *entropy = finish_wide(e_lo, e_hi);
}

// float_key of 16 lanes.
SPECDEC_TARGET_AVX512 inline __m512i float_keys(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(bits, sign), _mm512_setzero_si512());
  const __mmask16 negative = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
  return _mm512_mask_blend_epi32(negative, _mm512_or_si512(bits, sign),
                                 _mm512_xor_si512(bits, _mm512_set1_epi32(-1)));
}

SPECDEC_TARGET_AVX512 inline void write_probs_avx512(const float* l, int64_t begin, int64_t end,
                                                     const RowFilter& f, const float* table,
                                                     float* out) {
  const __m512 m = _mm512_set1_ps(f.max_logit);
  const __m512 inv_t = _mm512_set1_ps(f.inv_temperature);
  const __m512 floor_w = _mm512_set1_ps(f.min_weight);
  const __m512 total = _mm512_set1_ps(f.total);
  const __m512i min_key = _mm512_set1_epi32(static_cast<int32_t>(f.min_key));
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 k = tail_mask(end - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, l + i);
    const __m512 raw = raw_weights16(v, _mm512_mul_ps(_mm512_sub_ps(v, m), inv_t), table);
    const __mmask16 kept = _mm512_cmp_ps_mask(raw, floor_w, _CMP_GE_OQ) &
                           _mm512_cmp_epu32_mask(float_keys(v), min_key, _MM_CMPINT_NLT);
    _mm512_mask_storeu_ps(out + i, k, _mm512_div_ps(_mm512_maskz_mov_ps(kept, raw), total));
  }
}

// Compress-stores to memory are microcoded (slow) on some CPUs: compress in registers and
// store all 16 lanes; `out` has 16 entries of slack.
SPECDEC_TARGET_AVX512 inline int64_t gather_avx512(const float* l, int64_t begin, int64_t end,
                                                   float floor_value, int32_t* out) {
  const __m512 f = _mm512_set1_ps(floor_value);
  __m512i index = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(begin)),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i step = _mm512_set1_epi32(16);
  int64_t n = 0;
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 k = tail_mask(end - i);
    const __mmask16 keep = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, l + i), f, _CMP_GE_OQ);
    if (keep != 0) {
      _mm512_storeu_si512(out + n, _mm512_maskz_compress_epi32(keep, index));
      n += __builtin_popcount(keep);
    }
    index = _mm512_add_epi32(index, step);
  }
  return n;
}

// keys[i] = float_key(l[ids[i]]) and weights[i] = specdec_exp((l[ids[i]] - M) * invT).
SPECDEC_TARGET_AVX512 inline void keys_and_weights_avx512(const float* l, const int32_t* ids,
                                                          int64_t n, float max_logit,
                                                          float inv_temperature, uint32_t* keys,
                                                          float* weights) {
  const __m512 m = _mm512_set1_ps(max_logit);
  const __m512 inv_t = _mm512_set1_ps(inv_temperature);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512i idx = _mm512_maskz_loadu_epi32(k, ids + i);
    const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, idx, l, 4);
    _mm512_mask_storeu_epi32(keys + i, k, float_keys(v));
    _mm512_mask_storeu_ps(weights + i, k, simd::exp16(_mm512_mul_ps(_mm512_sub_ps(v, m), inv_t)));
  }
}

SPECDEC_TARGET_AVX512 inline int64_t count_avx512(const float* l, int64_t begin, int64_t end,
                                                  float floor_value) {
  const __m512 f = _mm512_set1_ps(floor_value);
  int64_t n = 0;
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 k = tail_mask(end - i);
    n += __builtin_popcount(_mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, l + i), f, _CMP_GE_OQ));
  }
  return n;
}

// ----------------------------------------------------------------------------- AVX2
//
// The same passes on 8 lanes. Tails shorter than a vector go through the portable code (scans)
// or masked loads; the double sums keep the portable code's eight partials (lane l sums the
// elements l, l + 8, ... of the range) and its combining order, so they equal it bit for bit.

// 8 values as float32 (widened exactly).
SPECDEC_TARGET_AVX2 inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_TARGET_AVX2 inline __m256 load8_f32(const c10::BFloat16* p) {
  return simd::bf16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SPECDEC_TARGET_AVX2 inline __m256 load8_f32(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Lanes [0, left) of a float32 vector at p, the others `fill` (left < 8).
SPECDEC_TARGET_AVX2 inline __m256 load8_tail(const float* p, int64_t left, __m256 fill) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane));
  return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, _mm256_castps_si256(keep)), keep);
}

// The block scan (finish_block_scan) on 8 lanes, as block_scan_avx512.
template <typename T>
SPECDEC_TARGET_AVX2 Scan block_scan_avx2(const T* x, float* out, int64_t begin, int64_t end,
                                         float* block_max) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  __m256 nan = _mm256_setzero_ps();
  bool nan_in_tail = false;
  float best = neg_inf;
  int64_t best_block = begin;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t block_end = std::min(end, b + kBlock);
    __m256 lanes = _mm256_set1_ps(neg_inf);
    int64_t i = b;
    for (; i + 8 <= block_end; i += 8) {
      const __m256 v = load8_f32(x + i);
      if (out != nullptr) _mm256_storeu_ps(out + i, v);
      lanes = _mm256_max_ps(v, lanes);  // a NaN lane leaves the maximum as it was
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    alignas(32) float lane_max[8];
    _mm256_store_ps(lane_max, lanes);
    float m = neg_inf;
    for (int l = 0; l < 8; ++l) m = lane_max[l] > m ? lane_max[l] : m;
    for (; i < block_end; ++i) {  // past the block's last full vector (the row's end)
      const float v = static_cast<float>(x[i]);
      if (out != nullptr) out[i] = v;
      nan_in_tail = nan_in_tail || v != v;
      m = v > m ? v : m;
    }
    if (block_max != nullptr) block_max[b / kBlock] = m;
    if (m > best) {
      best = m;
      best_block = b;
    }
  }
  return finish_block_scan(x, begin, end, best, best_block,
                           nan_in_tail || _mm256_movemask_ps(nan) != 0);
}

template <typename T>
SPECDEC_TARGET_AVX2 Scan scan_avx2(const T* x, int64_t begin, int64_t end) {
  return block_scan_avx2(x, nullptr, begin, end, nullptr);
}

template <typename T>
SPECDEC_TARGET_AVX2 Scan copy_scan_avx2(const T* x, float* out, int64_t begin, int64_t end,
                                        float* block_max) {
  return block_scan_avx2(x, out, begin, end, block_max);
}

// The eight lane partials (lanes 0-3 in lo, 4-7 in hi) combined as exp_sum_portable does.
SPECDEC_TARGET_AVX2 inline double finish_partials(__m256d lo, __m256d hi) {
  alignas(32) double p[8];
  _mm256_store_pd(p, lo);
  _mm256_store_pd(p + 4, hi);
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// raw_weights16 on 8 lanes.
SPECDEC_TARGET_AVX2 inline __m256 raw_weights8(__m256 v, __m256 a, const float* table) {
  if (table == nullptr) return simd::exp8(a);
  const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  const __m256i d = _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF)),
                                     _mm256_set1_epi32(kWeightTableLow));
  const __m256i last = _mm256_set1_epi32(kWeightTableSpan - 1);
  const __m256 held = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(d, last), last));
  const __m256i index =
      _mm256_add_epi32(d, _mm256_slli_epi32(_mm256_srli_epi32(bits, 15), kWeightTableSignShift));
  const __m256 looked = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), table, index, held, 4);
  if (_mm256_movemask_ps(held) == 0xFF) return looked;
  return _mm256_blendv_ps(simd::exp8(a), looked, held);
}

SPECDEC_TARGET_AVX2 inline void weight_table_avx2(float max_logit, float inv_temperature,
                                                  float* table) {
  const __m256 m = _mm256_set1_ps(max_logit);
  const __m256 inv_t = _mm256_set1_ps(inv_temperature);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int k = 0; k < 2 * kWeightTableSpan; k += 8) {  // a half is a multiple of 8
    const __m256i bits = _mm256_add_epi32(_mm256_set1_epi32(weight_table_bits(k)), lane);
    const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
    _mm256_storeu_ps(table + k, simd::exp8(_mm256_mul_ps(_mm256_sub_ps(v, m), inv_t)));
  }
}

SPECDEC_TARGET_AVX2 inline void add_wide(__m256 v, __m256d& lo, __m256d& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

SPECDEC_TARGET_AVX2 inline void exp_sum_avx2(const float* l, int64_t begin, int64_t end,
                                             float max_logit, float inv_temperature,
                                             float min_weight, const float* table, double* sum,
                                             double* entropy) {
  const __m256 floor_w = _mm256_set1_ps(min_weight);
  const __m256 m = _mm256_set1_ps(max_logit);
  const __m256 inv_t = _mm256_set1_ps(inv_temperature);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256d s_lo = _mm256_setzero_pd(), s_hi = _mm256_setzero_pd();
  __m256d e_lo = _mm256_setzero_pd(), e_hi = _mm256_setzero_pd();
  for (int64_t i = begin; i < end; i += 8) {
    const __m256 v = i + 8 <= end ? _mm256_loadu_ps(l + i) : load8_tail(l + i, end - i, neg_inf);
    const __m256 a = _mm256_mul_ps(_mm256_sub_ps(v, m), inv_t);
    const __m256 raw = raw_weights8(v, a, table);  // 0 on the tail's -inf lanes
    const __m256 w = _mm256_and_ps(_mm256_cmp_ps(raw, floor_w, _CMP_GE_OQ), raw);
    add_wide(w, s_lo, s_hi);
    if (entropy != nullptr) {
      const __m256 positive = _mm256_cmp_ps(w, _mm256_setzero_ps(), _CMP_GT_OQ);
      add_wide(_mm256_and_ps(positive, _mm256_mul_ps(w, a)), e_lo, e_hi);
    }
  }
  *sum = finish_partials(s_lo, s_hi);
  if (entropy != nullptr) *entropy = finish_partials(e_lo, e_hi);
}

// float_key of 8 lanes, as unsigned keys with the sign bit flipped (so that signed compares
// order them): key ^ 0x80000000 = bits ^ (sign mask of bits), with -0 as +0.
SPECDEC_TARGET_AVX2 inline __m256i flipped_keys(__m256 v) {
  __m256i bits = _mm256_castps_si256(v);
  const __m256i sign = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  bits = _mm256_andnot_si256(_mm256_cmpeq_epi32(bits, sign), bits);  // -0 -> +0
  return _mm256_xor_si256(bits, _mm256_and_si256(_mm256_srai_epi32(bits, 31),
                                                 _mm256_set1_epi32(0x7fffffff)));
}

SPECDEC_TARGET_AVX2 inline void write_probs_avx2(const float* l, int64_t begin, int64_t end,
                                                 const RowFilter& f, const float* table,
                                                 float* out) {
  const __m256 m = _mm256_set1_ps(f.max_logit);
  const __m256 inv_t = _mm256_set1_ps(f.inv_temperature);
  const __m256 floor_w = _mm256_set1_ps(f.min_weight);
  const __m256 total = _mm256_set1_ps(f.total);
  const __m256i min_key = _mm256_set1_epi32(static_cast<int32_t>(f.min_key ^ 0x80000000u));
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 v = _mm256_loadu_ps(l + i);
    const __m256 raw = raw_weights8(v, _mm256_mul_ps(_mm256_sub_ps(v, m), inv_t), table);
    const __m256 below_key = _mm256_castsi256_ps(_mm256_cmpgt_epi32(min_key, flipped_keys(v)));
    const __m256 kept = _mm256_andnot_ps(below_key, _mm256_cmp_ps(raw, floor_w, _CMP_GE_OQ));
    _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_and_ps(kept, raw), total));
  }
  write_probs_portable(l, i, end, f, table, out);
}

// Indices of the values >= floor_value, ascending; `out` has room for end - begin.
SPECDEC_TARGET_AVX2 inline int64_t gather_avx2(const float* l, int64_t begin, int64_t end,
                                               float floor_value, int32_t* out) {
  const __m256 f = _mm256_set1_ps(floor_value);
  int64_t n = 0, i = begin;
  for (; i + 8 <= end; i += 8) {
    unsigned keep = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + i), f, _CMP_GE_OQ)));
    while (keep != 0) {
      out[n++] = static_cast<int32_t>(i + __builtin_ctz(keep));
      keep &= keep - 1;
    }
  }
  return n + gather_portable(l, i, end, floor_value, out + n);
}

SPECDEC_TARGET_AVX2 inline int64_t count_avx2(const float* l, int64_t begin, int64_t end,
                                              float floor_value) {
  const __m256 f = _mm256_set1_ps(floor_value);
  int64_t n = 0, i = begin;
  for (; i + 8 <= end; i += 8)
    n += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + i), f, _CMP_GE_OQ)));
  return n + count_portable(l, i, end, floor_value);
}

SPECDEC_TARGET_AVX2 inline void keys_and_weights_avx2(const float* l, const int32_t* ids,
                                                      int64_t n, float max_logit,
                                                      float inv_temperature, uint32_t* keys,
                                                      float* weights) {
  const __m256 m = _mm256_set1_ps(max_logit);
  const __m256 inv_t = _mm256_set1_ps(inv_temperature);
  const __m256i flip = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids + i));
    const __m256 v = _mm256_i32gather_ps(l, idx, 4);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(keys + i), _mm256_xor_si256(flipped_keys(v), flip));
    _mm256_storeu_ps(weights + i, simd::exp8(_mm256_mul_ps(_mm256_sub_ps(v, m), inv_t)));
  }
  for (; i < n; ++i) {
    keys[i] = float_key(l[ids[i]]);
    weights[i] = specdec_exp(mul_rn(sub_rn(l[ids[i]], max_logit), inv_temperature));
  }
}
#endif  // SPECDEC_X86

// ----------------------------------------------------------------------------- dispatch

inline bool use_avx512() { return SPECDEC_X86 && simd::max_level() >= simd::kAvx512; }
inline bool use_avx2() { return SPECDEC_X86 && simd::max_level() >= simd::kAvx2; }

template <typename T>
constexpr bool kVectorised = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> ||
                             std::is_same_v<T, c10::Half>;

template <typename T>
Scan scan(const T* x, int64_t begin, int64_t end) {
#if SPECDEC_X86
  if constexpr (kVectorised<T>) {
    if (use_avx512()) return scan_avx512(x, begin, end);
    if (use_avx2()) return scan_avx2(x, begin, end);
  }
#endif
  return scan_portable(x, begin, end);
}

template <typename T>
Scan copy_scan(const T* x, float* out, int64_t begin, int64_t end, float* block_max) {
#if SPECDEC_X86
  if constexpr (kVectorised<T>) {
    if (use_avx512()) return copy_scan_avx512(x, out, begin, end, block_max);
    if (use_avx2()) return copy_scan_avx2(x, out, begin, end, block_max);
  }
#endif
  return copy_scan_portable(x, out, begin, end, block_max);
}

// table[k] = raw weight of the bf16 bits weight_table_bits(k), k < 2 * kWeightTableSpan.
inline void weight_table(float max_logit, float inv_temperature, float* table) {
#if SPECDEC_X86
  if (use_avx512()) return weight_table_avx512(max_logit, inv_temperature, table);
  if (use_avx2()) return weight_table_avx2(max_logit, inv_temperature, table);
#endif
  weight_table_portable(max_logit, inv_temperature, table);
}

// `table`: the row's weight table, or nullptr (the row is not bf16, or too short for one).
inline void exp_sum(const float* l, int64_t begin, int64_t end, float max_logit,
                    float inv_temperature, float min_weight, const float* table, double* sum,
                    double* entropy) {
#if SPECDEC_X86
  if (use_avx512())
    return exp_sum_avx512(l, begin, end, max_logit, inv_temperature, min_weight, table, sum,
                          entropy);
  if (use_avx2())
    return exp_sum_avx2(l, begin, end, max_logit, inv_temperature, min_weight, table, sum,
                        entropy);
#endif
  exp_sum_portable(l, begin, end, max_logit, inv_temperature, min_weight, table, sum, entropy);
}

// out[x] = p(x) = kept weight / total for x in [begin, end) (RowFilter::prob, vectorised).
inline void write_probs(const float* l, int64_t begin, int64_t end, const RowFilter& f,
                        const float* table, float* out) {
#if SPECDEC_X86
  if (use_avx512()) return write_probs_avx512(l, begin, end, f, table, out);
  if (use_avx2()) return write_probs_avx2(l, begin, end, f, table, out);
#endif
  write_probs_portable(l, begin, end, f, table, out);
}

inline int64_t gather_at_least(const float* l, int64_t begin, int64_t end, float floor_value,
                               int32_t* out) {
#if SPECDEC_X86
  if (use_avx512()) return gather_avx512(l, begin, end, floor_value, out);
  if (use_avx2()) return gather_avx2(l, begin, end, floor_value, out);
#endif
  return gather_portable(l, begin, end, floor_value, out);
}

inline void keys_and_weights(const float* l, const int32_t* ids, int64_t n, float max_logit,
                             float inv_temperature, uint32_t* keys, float* weights) {
#if SPECDEC_X86
  if (use_avx512())
    return keys_and_weights_avx512(l, ids, n, max_logit, inv_temperature, keys, weights);
  if (use_avx2())
    return keys_and_weights_avx2(l, ids, n, max_logit, inv_temperature, keys, weights);
#endif
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = float_key(l[ids[i]]);
    weights[i] = specdec_exp(mul_rn(sub_rn(l[ids[i]], max_logit), inv_temperature));
  }
}

inline int64_t count_at_least(const float* l, int64_t begin, int64_t end, float floor_value) {
#if SPECDEC_X86
  if (use_avx512()) return count_avx512(l, begin, end, floor_value);
  if (use_avx2()) return count_avx2(l, begin, end, floor_value);
#endif
  return count_portable(l, begin, end, floor_value);
}

}  // namespace rows
}  // namespace specdec
