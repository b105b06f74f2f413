// CPU kernels of the tree ops: the mask builder and tree attention.
//
// Tree attention: a task is up to 16 (token, query head) rows of one KV head; scores, softmax
// and the value sum are computed in an order that makes every row's result independent of the
// others (batch-invariant; see tree_attention_cpu_kernel).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_dot.h"
#include "core/sampling.h"
#include "tree_common.h"

namespace specdec {
namespace {

// ------------------------------------------------------------------------- build_tree_masks

template <typename index_t>
void build_tree_masks_cpu_kernel(const at::Tensor& parents, const at::Tensor& prefix_lens,
                                 TreeMaskOutputs& out) {
  const int64_t batch = parents.size(0);
  const int64_t nodes = parents.size(1);
  const int64_t words = tree_mask_words(nodes);
  const index_t* par = parents.const_data_ptr<index_t>();
  const index_t* lens = prefix_lens.const_data_ptr<index_t>();
  int32_t* packed = out.packed.mutable_data_ptr<int32_t>();
  bool* dense = out.mask.mutable_data_ptr<bool>();
  int64_t* position_ids = out.position_ids.mutable_data_ptr<int64_t>();
  int64_t* depth = out.depth.mutable_data_ptr<int64_t>();
  int64_t* paths = out.retrieve_paths.mutable_data_ptr<int64_t>();
  int64_t* num_leaves = out.num_leaves.mutable_data_ptr<int64_t>();

  at::parallel_for(0, batch * nodes, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / nodes;
      const int64_t j = i - b * nodes;
      int32_t* row = packed + i * words;
      const int64_t d = tree_node_row(par + b * nodes, j, row, words);
      depth[i] = d;
      position_ids[i] = static_cast<int64_t>(lens[b]) + (d > 0 ? d : 0);
      for (int64_t k = 0; k < nodes; ++k) dense[i * nodes + k] = tree_mask_bit(row, k);
    }
  });

  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<char> has_child(nodes);
    for (int64_t b = begin; b < end; ++b) {
      const index_t* p = par + b * nodes;
      std::fill(has_child.begin(), has_child.end(), 0);
      for (int64_t j = 0; j < nodes; ++j)
        if (p[j] >= 0) has_child[p[j]] = 1;
      int64_t leaves = 0;
      for (int64_t j = 0; j < nodes; ++j) {
        if (p[j] == kPadParent || has_child[j]) continue;
        write_tree_path(p, j, depth[b * nodes + j], paths + (b * nodes + leaves) * nodes);
        ++leaves;
      }
      num_leaves[b] = leaves;
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
build_tree_masks_cpu(const at::Tensor& parents, const at::Tensor& prefix_lens) {
  check_tree_mask_args(parents, prefix_lens);
  TreeMaskOutputs out = empty_tree_mask_outputs(parents);
  AT_DISPATCH_INDEX_TYPES(parents.scalar_type(), "build_tree_masks_cpu", [&] {
    check_tree_mask_values<index_t>(parents, prefix_lens);
    build_tree_masks_cpu_kernel<index_t>(parents, prefix_lens, out);
  });
  return {out.mask, out.packed, out.position_ids, out.depth, out.retrieve_paths, out.num_leaves};
}

// ------------------------------------------------------------------------- build_lookahead_masks

template <typename index_t>
void build_lookahead_masks_cpu_kernel(const at::Tensor& window, const at::Tensor& levels,
                                      int64_t tree_nodes, int64_t num_rows,
                                      LookaheadOutputs& out) {
  const int64_t batch = window.size(0);
  const int64_t columns = tree_nodes + num_rows;
  const int64_t words = tree_mask_words(columns);
  const index_t* w = window.const_data_ptr<index_t>();
  const index_t* l = levels.const_data_ptr<index_t>();
  int32_t* packed = out.packed.mutable_data_ptr<int32_t>();
  bool* dense = out.mask.mutable_data_ptr<bool>();
  int64_t* positions = out.positions.mutable_data_ptr<int64_t>();
  at::parallel_for(0, batch * num_rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / num_rows;
      const int64_t rows = lookahead_rows(w[b], l[b], num_rows);  // <= num_rows: checked
      int32_t* row = packed + i * words;
      positions[i] = lookahead_row(i - b * num_rows, w[b], rows, tree_nodes, row, words);
      for (int64_t k = 0; k < columns; ++k) dense[i * columns + k] = tree_mask_bit(row, k);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_lookahead_masks_cpu(
    const at::Tensor& window, const at::Tensor& levels, int64_t tree_nodes, int64_t num_rows) {
  check_lookahead_args(window, levels, tree_nodes, num_rows);
  LookaheadOutputs out = empty_lookahead_outputs(window, tree_nodes, num_rows);
  AT_DISPATCH_INDEX_TYPES(window.scalar_type(), "build_lookahead_masks_cpu", [&] {
    check_lookahead_values<index_t>(window, levels, tree_nodes, num_rows);
    build_lookahead_masks_cpu_kernel<index_t>(window, levels, tree_nodes, num_rows, out);
  });
  return {out.mask, out.packed, out.positions};
}

// ------------------------------------------------------------------------- tree_attention

// Query rows per task: (token, head-in-group) pairs of one KV head, in that order.
constexpr int64_t kRows = 16;

// Auto-vectorised loops compiled for AVX-512, AVX2 and baseline x86-64 (picked at load time).
// Every loop is elementwise over rows or head dims, so each element sees the same operations in
// the same order on every instruction set: the results do not depend on the one picked.
#if SPECDEC_X86
#define SPECDEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define SPECDEC_CLONES
#endif

// Scores of kRows rows stored key-major ([keys][kRows], -inf where masked) become unnormalised
// probabilities exp(s - max) (exact zeros where masked); row_sum gets their sums, added in key
// order. A row that sees no key keeps max = -inf and sum = 0.
SPECDEC_CLONES void softmax_key_major(float* __restrict scores, int64_t keys,
                                      float* __restrict row_sum) {
  float row_max[kRows];
  for (int64_t r = 0; r < kRows; ++r) row_max[r] = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < keys; ++s)
    for (int64_t r = 0; r < kRows; ++r) {
      const float x = scores[s * kRows + r];
      row_max[r] = x > row_max[r] ? x : row_max[r];
    }
  float shift[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    shift[r] = row_max[r] == -std::numeric_limits<float>::infinity() ? 0.0f : row_max[r];
    row_sum[r] = 0.0f;
  }
  for (int64_t s = 0; s < keys; ++s)
    for (int64_t r = 0; r < kRows; ++r) {
      const float e = specdec_exp(sub_rn(scores[s * kRows + r], shift[r]));  // -inf -> 0
      scores[s * kRows + r] = e;
      row_sum[r] = add_rn(row_sum[r], e);
    }
}

// acc[r, :] += p[s, r] * v[s, :] for every key s in order (keys a row does not see add nothing);
// `head_dim` dims of each value row from `values`, acc rows `acc_stride` apart (a caller may
// pass a slice of the head dims: every element's sum is the same operations either way).
SPECDEC_CLONES void accumulate_values(const float* __restrict probs, const float* __restrict values,
                                      int64_t value_stride, int64_t keys, int64_t rows,
                                      int64_t head_dim, int64_t acc_stride, float* __restrict acc) {
  for (int64_t s = 0; s < keys; ++s) {
    const float* v = values + s * value_stride;
    for (int64_t r = 0; r < rows; ++r) {
      const float p = probs[s * kRows + r];
      if (p == 0.0f) continue;
      float* a = acc + r * acc_stride;
      for (int64_t d = 0; d < head_dim; ++d) a[d] = add_rn(a[d], mul_rn(p, v[d]));
    }
  }
}

#if SPECDEC_X86
// The K/V rows this many keys ahead (8 KB of a 64-dim head) are requested while a key is used:
// with the hardware prefetcher alone, 2k-key caches were read at 7-10 GB/s on a 2-core Xeon,
// a third of what the linears' prefetched weight stream reaches (bench.attention_prefix: 8 keys
// ahead gained nothing measurable, 32 about a fifth).
constexpr int64_t kPrefetchKeys = 32;

// Requests the 64-byte lines of `count` elements from `row` (a hint: never faults).
template <typename T>
inline void prefetch_row(const T* row, int64_t count) {
  constexpr int64_t kPerLine = 64 / sizeof(T);
  for (int64_t i = 0; i < count; i += kPerLine) _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
}

// K/V elements read as float32 where they are used: bfloat16 and float16 widen exactly, so a
// narrow cache gives the bits of its float32 copy, without the copy (the cache is read once,
// at its own width).
inline float kv_float(float v) { return v; }
inline float kv_float(c10::BFloat16 v) { return static_cast<float>(v); }
inline float kv_float(c10::Half v) { return static_cast<float>(v); }

// Up to 16 elements (the lanes of `mask`; the others zero).
SPECDEC_TARGET_AVX512 inline __m512 load_kv16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
SPECDEC_TARGET_AVX512 inline __m512 load_kv16(const c10::BFloat16* p, __mmask16 mask) {
  const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}
SPECDEC_TARGET_AVX512 inline __m512 load_kv16(const c10::Half* p, __mmask16 mask) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}

// 8 elements.
SPECDEC_TARGET_AVX2 inline __m256 load_kv8(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_TARGET_AVX2 inline __m256 load_kv8(const c10::BFloat16* p) {
  const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
}
SPECDEC_TARGET_AVX2 inline __m256 load_kv8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// One element in all 8 lanes. bfloat16: a 16-bit broadcast holds the bits in both halves of
// each lane, so clearing the low halves leaves the float32 (one more instruction than float32,
// where widening the scalar first took four).
SPECDEC_TARGET_AVX2 inline __m256 broadcast_kv8(const float* p) { return _mm256_broadcast_ss(p); }
SPECDEC_TARGET_AVX2 inline __m256 broadcast_kv8(const c10::BFloat16* p) {
  const __m256i both = _mm256_set1_epi16(static_cast<short>(p->x));
  return _mm256_castsi256_ps(_mm256_and_si256(both, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
SPECDEC_TARGET_AVX2 inline __m256 broadcast_kv8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(p->x)));
}

// The lanes of `mask` (all-ones lanes of 8), zero elsewhere: AVX2 has no 16-bit masked load.
template <typename T>
SPECDEC_TARGET_AVX2 inline __m256 load_kv8_masked(const T* p, __m256i mask) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_maskload_ps(p, mask);
  } else {
    alignas(32) int32_t lanes[8];
    alignas(32) float wide[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), mask);
    for (int i = 0; i < 8; ++i) wide[i] = lanes[i] != 0 ? kv_float(p[i]) : 0.0f;
    return _mm256_load_ps(wide);
  }
}

// AVX-512 forms of the three steps. Scores and the value sums use FMAs (results differ from the
// portable loops, and the scores from the AVX2 ones, by rounding, like the dot tiles; see
// cpu_simd.h); the softmax is bit-identical.

// R query rows (R <= 4) against every key, head dims in C chunks of 16 (C <= 4): the rows
// stay in registers while the keys stream by.
template <int R, int C, typename T>
SPECDEC_TARGET_AVX512 void scores_held_rows_avx512(const float* q, int64_t head_dim, const T* k,
                                                   int64_t k_stride, int64_t keys, __mmask16 last,
                                                   float* scores) {
  __m512 qv[R][C];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) qv[i][j] = _mm512_maskz_loadu_ps(j + 1 < C ? __mmask16(0xFFFF) : last, q + i * head_dim + 16 * j);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t s = 0; s < keys; ++s) {
    const T* key = k + s * k_stride;
    prefetch_row(key + kPrefetchKeys * k_stride, C * 16);
    __m512 acc[4] = {zero, zero, zero, zero};
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) {
      const __m512 kv = load_kv16(key + 16 * j, j + 1 < C ? __mmask16(0xFFFF) : last);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) acc[i] = _mm512_fmadd_ps(qv[i][j], kv, acc[i]);
    }
    const __m128 sums = simd::reduce_add4(acc[0], acc[1], acc[2], acc[3]);
    if constexpr (R == 4) {
      _mm_storeu_ps(scores + s * kRows, sums);
    } else {
      _mm_mask_storeu_ps(scores + s * kRows, static_cast<__mmask8>((1u << R) - 1u), sums);
    }
  }
}

template <int R, typename T, int... C>
SPECDEC_TARGET_AVX512 void scores_held_rows_dispatch(int chunks, const float* q, int64_t head_dim,
                                                     const T* k, int64_t k_stride, int64_t keys,
                                                     __mmask16 last, float* scores,
                                                     std::integer_sequence<int, C...>) {
  ((chunks == C + 1 ? scores_held_rows_avx512<R, C + 1, T>(q, head_dim, k, k_stride, keys, last, scores)
                    : void()), ...);
}

// scores[key, r] = q_r . k_key for the first `rows` rows (q_rows [kRows][head_dim], zero past
// `rows`), key-major into scores [keys][kRows]: lane l of an accumulator sums the products of
// head dims d = l (mod 16) in d order (FMA chains), then simd::reduce_add's fixed tree, four
// rows at a time (the order does not depend on how many rows a task has: a token's scores are the
// same bits in a tree and alone). With the rows in lanes instead (one 16-lane FMA and a key
// broadcast per head dim, whatever the rows) the scores were half of a decoding token's
// attention, 3 query rows per KV head (56 us at 512 keys, 1 thread); by key, with the rows held
// in registers, a decoding token's attention from memory fell by a fifth to a third
// (`python3 -m bench.attention_prefix`, AVX-512, 2 threads: 25-26 -> 17-18 us a layer at
// prefix 256, 235 -> 155-165 at 2048) and 8 tokens' did not rise (318-354 -> 320-330 at 2048).
template <typename T>
SPECDEC_TARGET_AVX512 void scores_by_key_avx512(const float* q_rows, int64_t head_dim,
                                                const T* k, int64_t k_stride, int64_t keys,
                                                int64_t rows, float* scores) {
  const int64_t chunks = (head_dim + 15) / 16;
  const int64_t rest = head_dim - 16 * (chunks - 1);
  const __mmask16 last = rest == 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << rest) - 1u);
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const float* q = q_rows + r0 * head_dim;
    float* out = scores + r0;
    if (chunks <= 4) {  // head_dim <= 64: the rows in registers
      const int c = static_cast<int>(chunks);
      const auto seq = std::make_integer_sequence<int, 4>{};
      switch (std::min<int64_t>(4, rows - r0)) {
        case 1: scores_held_rows_dispatch<1, T>(c, q, head_dim, k, k_stride, keys, last, out, seq); break;
        case 2: scores_held_rows_dispatch<2, T>(c, q, head_dim, k, k_stride, keys, last, out, seq); break;
        case 3: scores_held_rows_dispatch<3, T>(c, q, head_dim, k, k_stride, keys, last, out, seq); break;
        default: scores_held_rows_dispatch<4, T>(c, q, head_dim, k, k_stride, keys, last, out, seq); break;
      }
      continue;
    }
    for (int64_t s = 0; s < keys; ++s) {
      const T* key = k + s * k_stride;
      __m512 acc[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t j = 0; j < chunks; ++j) {
        const __mmask16 mask = j + 1 < chunks ? __mmask16(0xFFFF) : last;
        const __m512 kv = load_kv16(key + 16 * j, mask);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
          acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + i * head_dim + 16 * j), kv, acc[i]);
      }
      _mm_storeu_ps(out + s * kRows, simd::reduce_add4(acc[0], acc[1], acc[2], acc[3]));
    }
  }
}

// softmax_key_major with the 16 rows in the lanes of one register.
SPECDEC_TARGET_AVX512 void softmax_key_major_avx512(float* scores, int64_t keys, float* row_sum) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 row_max = neg_inf;
  for (int64_t s = 0; s < keys; ++s) row_max = _mm512_max_ps(_mm512_loadu_ps(scores + s * kRows), row_max);
  const __mmask16 empty = _mm512_cmp_ps_mask(row_max, neg_inf, _CMP_EQ_OQ);
  const __m512 shift = _mm512_mask_blend_ps(empty, row_max, _mm512_setzero_ps());
  __m512 sum = _mm512_setzero_ps();
  for (int64_t s = 0; s < keys; ++s) {
    const __m512 e = simd::exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + s * kRows), shift));
    _mm512_storeu_ps(scores + s * kRows, e);
    sum = _mm512_add_ps(sum, e);
  }
  _mm512_storeu_ps(row_sum, sum);
}

// The shift of rows 0-3 of a key-major block: each row's maximum over the keys, 0 for a row
// that sees none (as the 8- and 16-lane forms take it).
inline __m128 four_row_shift(const float* scores, int64_t keys) {
  const __m128 neg_inf = _mm_set1_ps(-std::numeric_limits<float>::infinity());
  __m128 row_max = neg_inf;
  for (int64_t s = 0; s < keys; ++s) row_max = _mm_max_ps(_mm_loadu_ps(scores + s * kRows), row_max);
  return _mm_andnot_ps(_mm_cmpeq_ps(row_max, neg_inf), row_max);
}

// softmax_key_major_avx512 for a block of at most 4 real rows (one token's query heads of a KV
// head): four keys' 4-row scores share one register, so one exp covers four keys instead of
// one, and each row's sum still adds its keys one by one in key order (the bits of
// softmax_key_major_avx512 in lanes 0-3; the other lanes are not read for such a block). The
// 16-lane form spent 36% of a token's attention on the exp of 13 unused lanes (768 bfloat16
// keys, 2026-11-28, twenty-second session).
SPECDEC_TARGET_AVX512 void softmax_four_rows_avx512(float* scores, int64_t keys, float* row_sum) {
  const __m512 shift = _mm512_broadcast_f32x4(four_row_shift(scores, keys));
  __m128 sum = _mm_setzero_ps();
  int64_t s = 0;
  for (; s + 4 <= keys; s += 4) {
    float* p = scores + s * kRows;
    __m512 x = _mm512_castps128_ps512(_mm_loadu_ps(p));
    x = _mm512_insertf32x4(x, _mm_loadu_ps(p + kRows), 1);
    x = _mm512_insertf32x4(x, _mm_loadu_ps(p + 2 * kRows), 2);
    x = _mm512_insertf32x4(x, _mm_loadu_ps(p + 3 * kRows), 3);
    const __m512 e = simd::exp16(_mm512_sub_ps(x, shift));
    const __m128 e0 = _mm512_castps512_ps128(e), e1 = _mm512_extractf32x4_ps(e, 1),
                 e2 = _mm512_extractf32x4_ps(e, 2), e3 = _mm512_extractf32x4_ps(e, 3);
    _mm_storeu_ps(p, e0);
    _mm_storeu_ps(p + kRows, e1);
    _mm_storeu_ps(p + 2 * kRows, e2);
    _mm_storeu_ps(p + 3 * kRows, e3);
    sum = _mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_add_ps(sum, e0), e1), e2), e3);
  }
  for (; s < keys; ++s) {
    float* p = scores + s * kRows;
    const __m128 e = _mm512_castps512_ps128(
        simd::exp16(_mm512_sub_ps(_mm512_zextps128_ps512(_mm_loadu_ps(p)), shift)));
    _mm_storeu_ps(p, e);
    sum = _mm_add_ps(sum, e);
  }
  _mm_storeu_ps(row_sum, sum);
}

// acc[r, d] = sum over keys in order of p[key, r] * v[key, d] (FMA chains), 4 rows x 64 dims
// of accumulators at a time; keys none of the 4 rows sees are skipped.
template <typename T>
SPECDEC_TARGET_AVX512 void accumulate_values_avx512(const float* probs, const T* values,
                                                    int64_t value_stride, int64_t keys,
                                                    int64_t rows, int64_t head_dim,
                                                    int64_t acc_stride, float* acc) {
  constexpr int kRowBlock = 4, kDimVectors = 4;
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16 * kDimVectors) {
    __mmask16 masks[kDimVectors];
    for (int j = 0; j < kDimVectors; ++j) {
      const int64_t left = std::max<int64_t>(0, std::min<int64_t>(16, head_dim - d0 - 16 * j));
      masks[j] = static_cast<__mmask16>((1u << left) - 1u);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      __m512 a[kRowBlock][kDimVectors];
      for (int i = 0; i < kRowBlock; ++i)
        for (int j = 0; j < kDimVectors; ++j) a[i][j] = _mm512_setzero_ps();
      for (int64_t s = 0; s < keys; ++s) {
        const __m128 p = _mm_loadu_ps(probs + s * kRows + r0);  // rows past `rows` are 0
        if (_mm_movemask_ps(_mm_cmpneq_ps(p, _mm_setzero_ps())) == 0) continue;
        const T* v = values + s * value_stride + d0;
        prefetch_row(v + kPrefetchKeys * value_stride, std::min<int64_t>(64, head_dim - d0));
        __m512 vv[kDimVectors];
#pragma GCC unroll 4
        for (int j = 0; j < kDimVectors; ++j) vv[j] = load_kv16(v + 16 * j, masks[j]);
#pragma GCC unroll 4
        for (int i = 0; i < kRowBlock; ++i) {
          const __m512 pi = _mm512_set1_ps(probs[s * kRows + r0 + i]);
#pragma GCC unroll 4
          for (int j = 0; j < kDimVectors; ++j) a[i][j] = _mm512_fmadd_ps(pi, vv[j], a[i][j]);
        }
      }
      for (int i = 0; i < kRowBlock && r0 + i < rows; ++i)
        for (int j = 0; j < kDimVectors; ++j)
          _mm512_mask_storeu_ps(acc + (r0 + i) * acc_stride + d0 + 16 * j, masks[j], a[i][j]);
    }
  }
}

// AVX2 forms (16 ymm registers): the softmax the same exp and the value sums the same FMA
// chains in key order as the AVX-512 ones; the scores are summed in another order (below).

// scores[key, r] = sum_d q_t[d, r] * k[key, d], one FMA chain per (key, r) in d order (q_t:
// the kRows query rows transposed, [D][kRows]), the rows in RV vectors of 8 lanes (RV = 1 when
// at most 8 rows are real: lanes of the other vector are never read, the caller masks them).
// AVX-512 sums the scores by key instead (scores_by_key_avx512), so the two paths' scores
// differ by rounding; taken by key here, with 16 registers, tasks of many rows (verifying 8
// tokens) were 8-17% slower (bench.attention_prefix).
template <int RV, typename T>
SPECDEC_TARGET_AVX2 void scores_avx2(const float* q_t, const T* k, int64_t k_stride,
                                     int64_t keys, int64_t head_dim, float* scores) {
  constexpr int kKeys = 12 / RV;  // 12 accumulators
  int64_t s = 0;
  for (; s + kKeys <= keys; s += kKeys) {
    __m256 acc[kKeys][RV];
#pragma GCC unroll 12
    for (int i = 0; i < kKeys; ++i)
#pragma GCC unroll 2
      for (int v = 0; v < RV; ++v) acc[i][v] = _mm256_setzero_ps();
    const T* key = k + s * k_stride;
    for (int i = 0; i < kKeys; ++i) prefetch_row(key + (kPrefetchKeys + i) * k_stride, head_dim);
    for (int64_t d = 0; d < head_dim; ++d) {
      __m256 qd[RV];
#pragma GCC unroll 2
      for (int v = 0; v < RV; ++v) qd[v] = _mm256_loadu_ps(q_t + d * kRows + 8 * v);
#pragma GCC unroll 12
      for (int i = 0; i < kKeys; ++i) {
        const __m256 kd = broadcast_kv8(key + i * k_stride + d);
#pragma GCC unroll 2
        for (int v = 0; v < RV; ++v) acc[i][v] = _mm256_fmadd_ps(qd[v], kd, acc[i][v]);
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < kKeys; ++i)
#pragma GCC unroll 2
      for (int v = 0; v < RV; ++v) _mm256_storeu_ps(scores + (s + i) * kRows + 8 * v, acc[i][v]);
  }
  for (; s < keys; ++s) {
    __m256 acc[RV];
    for (int v = 0; v < RV; ++v) acc[v] = _mm256_setzero_ps();
    const T* key = k + s * k_stride;
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m256 kd = broadcast_kv8(key + d);
      for (int v = 0; v < RV; ++v)
        acc[v] = _mm256_fmadd_ps(_mm256_loadu_ps(q_t + d * kRows + 8 * v), kd, acc[v]);
    }
    for (int v = 0; v < RV; ++v) _mm256_storeu_ps(scores + s * kRows + 8 * v, acc[v]);
  }
}

// softmax_key_major_avx512 over the first 8 * RV lanes.
template <int RV>
SPECDEC_TARGET_AVX2 void softmax_key_major_avx2(float* scores, int64_t keys, float* row_sum) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 row_max[RV], shift[RV], sum[RV];
  for (int v = 0; v < RV; ++v) row_max[v] = neg_inf;
  for (int64_t s = 0; s < keys; ++s)
    for (int v = 0; v < RV; ++v)
      row_max[v] = _mm256_max_ps(_mm256_loadu_ps(scores + s * kRows + 8 * v), row_max[v]);
  for (int v = 0; v < RV; ++v) {
    const __m256 empty = _mm256_cmp_ps(row_max[v], neg_inf, _CMP_EQ_OQ);
    shift[v] = _mm256_andnot_ps(empty, row_max[v]);
    sum[v] = _mm256_setzero_ps();
  }
  for (int64_t s = 0; s < keys; ++s)
    for (int v = 0; v < RV; ++v) {
      float* p = scores + s * kRows + 8 * v;
      const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(p), shift[v]));
      _mm256_storeu_ps(p, e);
      sum[v] = _mm256_add_ps(sum[v], e);
    }
  for (int v = 0; v < RV; ++v) _mm256_storeu_ps(row_sum + 8 * v, sum[v]);
}

// softmax_four_rows_avx512 on the AVX2 path: two keys' 4-row scores a register.
SPECDEC_TARGET_AVX2 void softmax_four_rows_avx2(float* scores, int64_t keys, float* row_sum) {
  const __m128 shift4 = four_row_shift(scores, keys);
  const __m256 shift = _mm256_set_m128(shift4, shift4);
  __m128 sum = _mm_setzero_ps();
  int64_t s = 0;
  for (; s + 2 <= keys; s += 2) {
    float* p = scores + s * kRows;
    const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_set_m128(_mm_loadu_ps(p + kRows), _mm_loadu_ps(p)), shift));
    const __m128 e0 = _mm256_castps256_ps128(e), e1 = _mm256_extractf128_ps(e, 1);
    _mm_storeu_ps(p, e0);
    _mm_storeu_ps(p + kRows, e1);
    sum = _mm_add_ps(_mm_add_ps(sum, e0), e1);
  }
  if (s < keys) {
    float* p = scores + s * kRows;
    const __m128 e = _mm256_castps256_ps128(
        simd::exp8(_mm256_sub_ps(_mm256_zextps128_ps256(_mm_loadu_ps(p)), shift)));
    _mm_storeu_ps(p, e);
    sum = _mm_add_ps(sum, e);
  }
  _mm_storeu_ps(row_sum, sum);
}

// R rows (R <= 3) of accumulate_values_avx512 over 32 head dims (kFull: all 32 are there, else
// the lanes of `masks`): 4R accumulators, R probabilities and a value vector fit the 16
// registers. `probs` starts at the block's first row, `values` and `acc` at its first dim.
// Keys none of the R rows sees are skipped (one compare of their probabilities).
template <int R, bool kFull, typename T>
SPECDEC_TARGET_AVX2 void value_rows_avx2(const float* probs, const T* values,
                                         int64_t value_stride, int64_t keys, int64_t dims,
                                         const __m256i* masks, int64_t acc_stride, float* acc) {
  constexpr int kDimVectors = 4;
  __m256 a[R][kDimVectors];
#pragma GCC unroll 3
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < kDimVectors; ++j) a[i][j] = _mm256_setzero_ps();
  for (int64_t s = 0; s < keys; ++s) {
    prefetch_row(values + (s + kPrefetchKeys) * value_stride, dims);
    const float* p = probs + s * kRows;
    // Blocks of 2-3 rows start at row kRows - 4 at the latest (blocks of 3 from row 0; a lone
    // last row is R = 1), so the 4 floats from p are this key's.
    const int seen =
        R == 1 ? p[0] != 0.0f
               : _mm_movemask_ps(_mm_cmpneq_ps(_mm_loadu_ps(p), _mm_setzero_ps())) & ((1 << R) - 1);
    if (!seen) continue;
    __m256 pi[R];
#pragma GCC unroll 3
    for (int i = 0; i < R; ++i) pi[i] = _mm256_broadcast_ss(p + i);
    const T* v = values + s * value_stride;
#pragma GCC unroll 4
    for (int j = 0; j < kDimVectors; ++j) {
      // Plain loads where all 32 dims are there: vmaskmovps streaming 2k value rows from
      // memory made this loop twice as slow on Zen 4 (bench.attention_prefix, 2026-11-26).
      const __m256 vv = kFull ? load_kv8(v + 8 * j) : load_kv8_masked(v + 8 * j, masks[j]);
#pragma GCC unroll 3
      for (int i = 0; i < R; ++i) a[i][j] = _mm256_fmadd_ps(pi[i], vv, a[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kDimVectors; ++j)
      _mm256_maskstore_ps(acc + i * acc_stride + 8 * j, masks[j], a[i][j]);
}

// accumulate_values_avx512 in blocks of 3 rows x 32 dims (value_rows_avx2). The same FMA chains
// in key order: a row's sums do not depend on its block.
template <typename T>
SPECDEC_TARGET_AVX2 void accumulate_values_avx2(const float* probs, const T* values,
                                                int64_t value_stride, int64_t keys, int64_t rows,
                                                int64_t head_dim, int64_t acc_stride, float* acc) {
  constexpr int kRowBlock = 3, kDims = 32;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t d0 = 0; d0 < head_dim; d0 += kDims) {
    __m256i masks[4];
    for (int j = 0; j < 4; ++j) {
      const int64_t left = std::max<int64_t>(0, std::min<int64_t>(8, head_dim - d0 - 8 * j));
      masks[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane);
    }
    const int64_t dims = std::min<int64_t>(kDims, head_dim - d0);
    const bool full = dims == kDims;
    for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      const int live = static_cast<int>(std::min<int64_t>(kRowBlock, rows - r0));
      const float* p = probs + r0;
      const T* v = values + d0;
      float* out = acc + r0 * acc_stride + d0;
      switch (2 * live + (full ? 1 : 0)) {
        case 2: value_rows_avx2<1, false, T>(p, v, value_stride, keys, dims, masks, acc_stride, out); break;
        case 3: value_rows_avx2<1, true, T>(p, v, value_stride, keys, dims, masks, acc_stride, out); break;
        case 4: value_rows_avx2<2, false, T>(p, v, value_stride, keys, dims, masks, acc_stride, out); break;
        case 5: value_rows_avx2<2, true, T>(p, v, value_stride, keys, dims, masks, acc_stride, out); break;
        case 6: value_rows_avx2<3, false, T>(p, v, value_stride, keys, dims, masks, acc_stride, out); break;
        default: value_rows_avx2<3, true, T>(p, v, value_stride, keys, dims, masks, acc_stride, out);
      }
    }
  }
}
#endif

// Rows [0, keys) of a K or V cache slice as `row_t` rows `stride` apart: the cache itself when
// `row_t` is its type (the vector code reads every cache type), else a float32 copy in
// `buffer` (the portable code reads float32 only).
template <typename row_t, typename cache_t>
const row_t* kv_rows(const cache_t* rows, int64_t row_stride, int64_t keys, int64_t head_dim,
                     std::vector<float>& buffer, int64_t& stride) {
  if constexpr (std::is_same_v<row_t, cache_t>) {
    (void)keys, (void)head_dim, (void)buffer;
    stride = row_stride;
    return rows;
  } else {
    static_assert(std::is_same_v<row_t, float>, "copies are float32");
    buffer.resize(keys * head_dim);
    for (int64_t i = 0; i < keys; ++i)
      for (int64_t d = 0; d < head_dim; ++d)
        buffer[i * head_dim + d] = static_cast<float>(rows[i * row_stride + d]);
    stride = head_dim;
    return buffer.data();
  }
}

// The vector code's scores of `rows` real query rows (AVX2: transposed into q_t first); a no-op
// without x86 vector code.
template <typename T>
inline void score_rows_vector(bool avx512, const float* q_rows, float* q_t, int64_t head_dim,
                              const T* k, int64_t k_stride, int64_t keys, int64_t rows,
                              float* scores) {
#if SPECDEC_X86
  if (avx512) {
    scores_by_key_avx512(q_rows, head_dim, k, k_stride, keys, rows, scores);
    return;
  }
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t d = 0; d < head_dim; ++d) q_t[d * kRows + r] = q_rows[r * head_dim + d];
  if (rows <= 8) {
    scores_avx2<1, T>(q_t, k, k_stride, keys, head_dim, scores);
  } else {
    scores_avx2<2, T>(q_t, k, k_stride, keys, head_dim, scores);
  }
#else
  (void)avx512, (void)q_rows, (void)q_t, (void)head_dim, (void)k, (void)k_stride, (void)keys,
      (void)rows, (void)scores;
#endif
}

// Highest tree node visible to a mask row, or -1.
inline int64_t last_visible_node(const int32_t* row, int64_t words) {
  for (int64_t w = words - 1; w >= 0; --w)
    if (row[w] != 0) return w * 32 + 31 - __builtin_clz(static_cast<uint32_t>(row[w]));
  return -1;
}

// A task's scores, [keys][kRows]: grown without being zeroed (every lane a stage reads is
// written first) and kept by its thread between calls. Zeroing a fresh 128 KB vector per KV
// head was 7% of a decoding token's attention at 2k keys (2-core Zen 4, perf, 2026-12-04).
struct ScoreBuffer {
  std::unique_ptr<float[]> data;
  int64_t capacity = 0;

  float* at_least(int64_t n) {
    if (n > capacity) {
      data.reset(new float[n]);
      capacity = n;
    }
    return data.get();
  }
};

// One task of tree attention: up to kRows (token, query head) rows of one KV head of one
// request, and what its three stages (scores, softmax, value sums) share.
template <typename row_t>
struct AttentionTask {
  int64_t b = 0, h = 0, i0 = 0, rows = 0, cache_len = 0, keys = 0;
  int64_t k_stride = 0, v_stride = 0;
  const row_t* k_rows = nullptr;
  const row_t* v_rows = nullptr;
  const int32_t* row_mask[kRows] = {};
  float* scores = nullptr;  // from a ScoreBuffer
  std::vector<float> q_rows, acc, k_buf, v_buf;
  float row_sum[kRows] = {};
};

// Score lanes the softmax and the value sums read for a task of `rows` rows: the vector code
// takes a block of at most 4 rows with the four-row softmax (lanes 0-3); everything else reads
// all kRows lanes. Lanes from `rows` up to this are masked (-inf) so they add nothing.
inline int64_t lanes_read(bool vector, int64_t rows) { return vector && rows <= 4 ? 4 : kRows; }

// Keys per piece of a task's scores when a step has fewer tasks than threads to keep busy
// (decoding one token: one task per KV head).
constexpr int64_t kKeyPiece = 256;

// The value sums of such a step: the tasks' head dims laid end to end, in units of kDimUnit,
// cut into one equal span per thread, so each thread streams whole V rows of most of its tasks
// and at most the two tasks at its span's ends are shared by dims. The AVX2 value sums work in
// blocks of 32 dims, the AVX-512 ones in 64 (4 registers a row), and a task cut in 32-dim pieces
// walks all its keys at half width per piece (95 against 76 us a layer at 2048 keys for the
// AVX-512 path on a 2-core Zen 5, 2026-11-28). Pieces of 64 per task instead left the 3 KV
// heads of the default model 2:1 over 2 threads: one thread summed two heads' values while the
// other waited (2-core Zen 4, perf, 2026-12-04).
constexpr int64_t kDimUnit = 32;

// Calls segment(task, d0, d1) for thread `part` of `parts`: units [U part / parts,
// U (part + 1) / parts) of the U = tasks * ceil(head_dim / kDimUnit) units, consecutive units of
// one task joined into one segment.
template <typename Segment>
inline void for_value_span(int64_t tasks, int64_t head_dim, int64_t part, int64_t parts,
                           const Segment& segment) {
  const int64_t per_task = ceil_div(head_dim, kDimUnit), units = tasks * per_task;
  const int64_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
  for (int64_t u = u0; u < u1;) {
    const int64_t task = u / per_task, last = std::min(u1, (task + 1) * per_task);
    segment(task, (u % per_task) * kDimUnit, std::min(head_dim, (last - task * per_task) * kDimUnit));
    u = last;
  }
}

// Batch-invariant tree attention. Each row's output depends only on its own query, the keys and
// values it sees and their order: scores are fixed-order dot products (cpu_dot.h), the softmax
// takes the exact maximum and sums exp(s - max) in key order, the values are accumulated in key
// order, and unseen keys contribute exact zeros (or are skipped). So a token's output is
// bit-identical whether it is verified in a tree of T tokens, alone, or decoded one at a time
// after its ancestors were committed (then at other cache rows, but in the same order).
//
// The work is scheduled in one of two ways that compute every element with the same operations
// in the same order, so they give the same bits: one parallel task per row block (many rows:
// trees, prefill), or, when there are fewer tasks than twice the threads and long prefixes
// (decoding a token: 3 tasks on the default model), the scores split by keys and the value sums
// by head dims over the threads: a score is one key's dot product, and a value sum element is
// one (row, dim)'s chain over the keys, so neither depends on the split. (One task per KV head
// leaves a thread idle a third of the time on 2 threads.)
//
// `scalar_t` is the queries' and output's type, `cache_t` the cache's (the same, or bfloat16 /
// float16 under float32 queries), `row_t` the type the stages read K/V rows as: `cache_t` for
// the vector code, float32 copies for the portable code. Widening is exact, so every
// combination gives the bits of float32 rows holding the cache's values.
template <typename scalar_t, typename cache_t, typename row_t, typename index_t>
void tree_attention_cpu_kernel(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& cache_lens,
                               const at::Tensor& tree_mask, float scale, at::Tensor& out,
                               const TreeAttentionShape& s) {
  using Task = AttentionTask<row_t>;
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t head_dim = s.head_dim;
  const int64_t total_rows = s.tokens * group;
  const int64_t row_blocks = ceil_div(total_rows, kRows);
  const int64_t num_tasks = s.batch * s.kv_heads * row_blocks;
  const scalar_t* q_ptr = q.const_data_ptr<scalar_t>();
  const cache_t* k_ptr = k_cache.const_data_ptr<cache_t>();
  const cache_t* v_ptr = v_cache.const_data_ptr<cache_t>();
  const index_t* lens = cache_lens.const_data_ptr<index_t>();
  const int32_t* mask = tree_mask.const_data_ptr<int32_t>();
  scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
  const auto qs = q.strides();
  const auto ks = k_cache.strides();
  const auto vs = v_cache.strides();
  const int level = simd::max_level();
  const dot::TileTable& tiles = dot::tiles_for<float>(level);
  const bool avx512 = SPECDEC_X86 && level >= simd::kAvx512;
  const bool vector = SPECDEC_X86 && level >= simd::kAvx2;
  TORCH_INTERNAL_ASSERT((vector || std::is_same_v<row_t, float>), "portable code reads float32 rows");

  // The task's scaled query rows, masks, key count and float32 K/V rows; scores in `buffer`.
  auto prepare = [&](int64_t task, Task& t, ScoreBuffer& buffer) {
    t.i0 = (task % row_blocks) * kRows;
    t.h = (task / row_blocks) % s.kv_heads;
    t.b = task / (row_blocks * s.kv_heads);
    t.rows = std::min(kRows, total_rows - t.i0);
    t.cache_len = lens[t.b];
    t.q_rows.assign(kRows * head_dim, 0.0f);
    // Row r is tree token (i0 + r) / group, query head h * group + (i0 + r) % group.
    int64_t last_node = -1;
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t tok = (t.i0 + r) / group, g = (t.i0 + r) % group;
      const scalar_t* src = q_ptr + t.b * qs[0] + tok * qs[1] + (t.h * group + g) * qs[2];
      for (int64_t d = 0; d < head_dim; ++d)
        t.q_rows[r * head_dim + d] = mul_rn(static_cast<float>(src[d]), scale);
      t.row_mask[r] = mask + (t.b * s.tokens + tok) * s.words;
      // Bits past the block's tokens are padding (as build_tree_masks leaves them zero; the
      // reference and the CUDA kernel never read them): they must not reach cache rows past it.
      last_node = std::max(last_node, std::min(last_visible_node(t.row_mask[r], s.words), s.tokens - 1));
    }
    t.keys = t.cache_len + last_node + 1;
    if (t.keys > 0) {
      t.k_rows = kv_rows<row_t>(k_ptr + t.b * ks[0] + t.h * ks[1], ks[2], t.keys, head_dim, t.k_buf, t.k_stride);
      t.v_rows = kv_rows<row_t>(v_ptr + t.b * vs[0] + t.h * vs[1], vs[2], t.keys, head_dim, t.v_buf, t.v_stride);
      t.scores = buffer.at_least(t.keys * kRows);
    }
  };

  // scores[key, r] = (scaled q_r) . k_key for keys [k0, k1), key-major; then the tree mask.
  auto score_keys = [&](Task& t, int64_t k0, int64_t k1, std::vector<float>& q_t) {
    float* scores = t.scores;
    const row_t* k_rows = t.k_rows + k0 * t.k_stride;
    if (vector) {
      score_rows_vector(avx512, t.q_rows.data(), q_t.data(), head_dim, k_rows, t.k_stride,
                        k1 - k0, t.rows, scores + k0 * kRows);
    } else if constexpr (std::is_same_v<row_t, float>) {
      for (int64_t r0 = 0; r0 < t.rows; r0 += tiles.weight_tile) {
        const int nr = static_cast<int>(std::min<int64_t>(tiles.weight_tile, t.rows - r0));
        for (int64_t key = k0; key < k1; key += tiles.row_tile) {
          const int mr = static_cast<int>(std::min<int64_t>(tiles.row_tile, k1 - key));
          tiles.table[mr - 1][nr - 1](t.k_rows + key * t.k_stride, t.k_stride,
                                      t.q_rows.data() + r0 * head_dim, head_dim, head_dim,
                                      nullptr, scores + key * kRows + r0, kRows, nullptr, 0);
        }
      }
    }
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const int64_t lanes = lanes_read(vector, t.rows);
    for (int64_t key = std::max(k0, t.cache_len); key < k1; ++key)
      for (int64_t r = 0; r < lanes; ++r)
        if (r >= t.rows || !tree_mask_bit(t.row_mask[r], key - t.cache_len)) scores[key * kRows + r] = kNegInf;
    for (int64_t r = t.rows; r < lanes; ++r)
      for (int64_t key = k0; key < std::min(k1, t.cache_len); ++key) scores[key * kRows + r] = kNegInf;
  };

  // Scores become exp(s - max) in place; row_sum their sums in key order.
  auto softmax = [&](Task& t) {
    if (t.keys == 0) {
      std::fill(t.row_sum, t.row_sum + kRows, 0.0f);
      return;
    }
#if SPECDEC_X86
    if (avx512) {
      if (t.rows <= 4) {
        softmax_four_rows_avx512(t.scores, t.keys, t.row_sum);
      } else {
        softmax_key_major_avx512(t.scores, t.keys, t.row_sum);
      }
      return;
    }
    if (vector) {
      if (t.rows <= 4) {
        softmax_four_rows_avx2(t.scores, t.keys, t.row_sum);
      } else if (t.rows <= 8) {
        softmax_key_major_avx2<1>(t.scores, t.keys, t.row_sum);
      } else {
        softmax_key_major_avx2<2>(t.scores, t.keys, t.row_sum);
      }
      return;
    }
#endif
    softmax_key_major(t.scores, t.keys, t.row_sum);
  };

  // Value sums of head dims [d0, d1) (acc, row stride head_dim), then those dims of the output.
  // Rows that saw no key at all (an empty mask row over an empty prefix) are zero.
  auto sum_values = [&](Task& t, int64_t d0, int64_t d1) {
    float* acc = t.acc.data() + d0;
    if (t.keys > 0) {
      const row_t* v = t.v_rows + d0;
#if SPECDEC_X86
      if (avx512) {
        accumulate_values_avx512(t.scores, v, t.v_stride, t.keys, t.rows, d1 - d0, head_dim, acc);
      } else if (vector) {
        accumulate_values_avx2(t.scores, v, t.v_stride, t.keys, t.rows, d1 - d0, head_dim, acc);
      } else
#endif
      if constexpr (std::is_same_v<row_t, float>) {
        accumulate_values(t.scores, v, t.v_stride, t.keys, t.rows, d1 - d0, head_dim, acc);
      }
    }
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t tok = (t.i0 + r) / group, g = (t.i0 + r) % group;
      scalar_t* dst = out_ptr + ((t.b * s.tokens + tok) * s.q_heads + t.h * group + g) * head_dim;
      for (int64_t d = d0; d < d1; ++d)
        dst[d] = static_cast<scalar_t>(t.row_sum[r] > 0.f ? div_rn(t.acc[r * head_dim + d], t.row_sum[r]) : 0.f);
    }
  };

  const int64_t threads = at::get_num_threads();
  int64_t longest = 0;
  for (int64_t b = 0; b < s.batch; ++b) longest = std::max<int64_t>(longest, lens[b]);
  const bool in_place = std::is_same_v<row_t, cache_t>;  // copies are made per task
  if (!(in_place && threads > 1 && num_tasks < 2 * threads && longest >= 2 * kKeyPiece)) {
    at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
      thread_local ScoreBuffer buffer;
      Task t;
      std::vector<float> q_t(kRows * head_dim);
      for (int64_t task = begin; task < end; ++task) {
        prepare(task, t, buffer);
        if (t.keys > 0) score_keys(t, 0, t.keys, q_t);
        softmax(t);
        t.acc.assign(kRows * head_dim, 0.0f);
        sum_values(t, 0, head_dim);
      }
    });
    return;
  }
  // Few tasks: every stage split over the threads (the same operations, see above).
  thread_local std::vector<ScoreBuffer> buffers;  // the calling thread's, one a task
  if (static_cast<int64_t>(buffers.size()) < num_tasks) buffers.resize(num_tasks);
  std::vector<Task> tasks(num_tasks);
  std::vector<std::pair<int64_t, int64_t>> key_pieces;  // (task, first key)
  for (int64_t task = 0; task < num_tasks; ++task) {
    prepare(task, tasks[task], buffers[task]);
    for (int64_t k0 = 0; k0 < tasks[task].keys; k0 += kKeyPiece) key_pieces.emplace_back(task, k0);
  }
  at::parallel_for(0, static_cast<int64_t>(key_pieces.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q_t(kRows * head_dim);
    for (int64_t i = begin; i < end; ++i) {
      Task& t = tasks[key_pieces[i].first];
      const int64_t k0 = key_pieces[i].second;
      score_keys(t, k0, std::min(k0 + kKeyPiece, t.keys), q_t);
    }
  });
  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      softmax(tasks[task]);
      tasks[task].acc.assign(kRows * head_dim, 0.0f);
    }
  });
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part)
      for_value_span(num_tasks, head_dim, part, threads, [&](int64_t task, int64_t d0, int64_t d1) {
        sum_values(tasks[task], d0, d1);
      });
  });
}

at::Tensor tree_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const at::Tensor& cache_lens,
                              const at::Tensor& tree_mask, double scale) {
  const TreeAttentionShape s = check_tree_attention_args(q, k_cache, v_cache, cache_lens, tree_mask,
                                                        /*narrow_cache_allowed=*/true);
  at::Tensor out = at::empty({s.batch, s.tokens, s.q_heads, s.head_dim}, q.options());
  const bool vector = SPECDEC_X86 && simd::max_level() >= simd::kAvx2;
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "tree_attention_cpu", [&] {
    check_cache_lens_values<index_t>(cache_lens, s);
    using lens_t = index_t;
    // The cache's type (q's, or narrower under float32 q), then q's.
    auto with_cache = [&](auto cache_zero) {
      using cache_t = decltype(cache_zero);
      auto run = [&](auto query_zero) {
        using q_t = decltype(query_zero);
        if (vector) {
          tree_attention_cpu_kernel<q_t, cache_t, cache_t, lens_t>(
              q, k_cache, v_cache, cache_lens, tree_mask, static_cast<float>(scale), out, s);
        } else {
          tree_attention_cpu_kernel<q_t, cache_t, float, lens_t>(
              q, k_cache, v_cache, cache_lens, tree_mask, static_cast<float>(scale), out, s);
        }
      };
      if (q.scalar_type() == k_cache.scalar_type()) {
        run(cache_t{});
      } else {
        run(float{});  // the checks allow only float32 q over a narrower cache
      }
    };
    switch (k_cache.scalar_type()) {
      case at::kBFloat16: with_cache(c10::BFloat16{}); break;
      case at::kHalf: with_cache(c10::Half{}); break;
      default: with_cache(float{});  // the checks allow float32, bfloat16, float16
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("build_tree_masks", &build_tree_masks_cpu);
  m.impl("build_lookahead_masks", &build_lookahead_masks_cpu);
  m.impl("tree_attention", &tree_attention_cpu);
}

}  // namespace specdec
