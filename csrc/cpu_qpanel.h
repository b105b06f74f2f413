// Panel tiles of quantized_linear (csrc/quantized_linear.cpp): int4 or int8 weights repacked
// so that 16 weight rows lie along the vector lanes (llama.cpp's repacked GEMM formats do the
// same).
//
// Why: the row layout (cpu_qdot.h) puts K along the lanes, so every output pays a float
// conversion, a scale product and an FMA per 128 values and a horizontal reduction at the end.
// Here one vpdpbusd advances 16 outputs by 4 values each (x enters as a broadcast 4-byte
// group), the float work is once per (x row, 16 weight rows, block of 32) and there is no
// reduction. On the 2-core Zen 5 (bench/kernel_ab/packed_int4.cpp, a step's int4 linears from
// memory) it took 0.43-0.58x the row layout's time at M = 1..16 on AVX-512.
//
// Layout (ops.quantized_linear, models/quantized_weight.py pack_panels), group 32:
//   int4: qweight [N / 16, K / 32, 256] uint8: for panel p and block b, byte 64 j + 4 r + i
//     (j < 4, r < 16, i < 4) is byte 4 j + i of row 16 p + r's block b in the row layout
//     (value 4 j + i in the low nibble, value 4 j + i + 16 in the high nibble, unsigned).
//   int8: qweight [N / 16, K / 32, 512] int8: byte 64 j + 4 r + i (j < 8) is value 4 j + i of
//     row 16 p + r's block b.
//   scales, mins [N / 16, K / 32, 16] float32 or float16: entry r of (p, b) is row 16 p + r's.
//   int8 in groups of 16 (a GGUF Q6_K's sub-blocks; no mins): scales [N / 16, K / 32, 32], entry
//     16 h + r of (p, b) is row 16 p + r's scale of the block's half h (values 16 h .. 16 h + 15).
//   K-quant scales as the file holds them (GGUF Q4_K, Q5_K, Q6_K; K a multiple of 256): int8
//     [N / 16, K / 256, 8 E + 32] with E the entries a block has above (16, or 32 in groups of
//     16): per super-block of 8 blocks, block j's E int8 sub-scales at bytes E j .., then the 16
//     rows' float16 super-scale d at bytes 8 E + 2 r. The scale is d * sub (exact in float32:
//     11 by 8 significant bits), so these give the bits of the float32 scales they encode, in
//     about a sixth of the bytes. Mins alike (E = 16) with min = -(dmin * sub).
//
// Arithmetic of one output, identical on every instruction set (the integer sums are exact and
// the float operations are the same fused ones in the same order), and independent of M, of a
// row's place in the batch and of threads:
//   acc = 0
//   for each block b:  acc = fma(float(isum_b), scale_b * xscale_b, acc)
//                      acc = fma(min_b, xsum_b, acc)            (with mins)
// where isum_b is the exact integer dot product of the block's 32 weight and x values, xscale_b
// and the int8 x values come from quantizing the x row per block of 32 (the row layout's
// quantizer), and xsum_b = float(sum of the block's int8 x values) * xscale_b. In groups of 16
// the block's halves are two such terms, half 0 first:
//                      acc = fma(float(isum_bh), scale_bh * xscale_b, acc)   (h = 0, 1)
#pragma once

#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_qdot.h"
#include "cpu_simd.h"

namespace specdec {
namespace qpanel {

constexpr int kPanelRows = 16;  // weight rows per panel
constexpr int kBlock = 32;      // values per block (the group)
// Bytes of one (panel, block): 16 rows x 32 values, two int4 values or one int8 per byte.
constexpr int block_bytes(bool int4) { return int4 ? 256 : 512; }
// Vectors of 16 lanes x 4 values per (panel, block): the operands of 8 dot products either way
// (int4: 4 vectors of bytes give 4 low-nibble and 4 high-nibble operands).
constexpr int kOperands = 8;
// Blocks fetched ahead: a panel is one contiguous stream (and the next panel follows it).
constexpr int kPrefetchBlocks = 16;

// x rows quantized for the panel tiles: int8 in K order, per block a scale, the dequantized
// sum (the min term's factor) and the integer sum (int8 weights' offset, below), and the
// integer sums of its two halves (the same offset in groups of 16).
struct PanelRows {
  int64_t rows = 0, K = 0, blocks = 0;
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
  std::vector<int32_t> isum, half_isum;
};

// Gives `out` room for `rows` quantized rows of K (filled by quantize_blocks), keeping the
// storage it has: one PanelRows serves every linear of a forward without reallocating.
inline void resize_rows(PanelRows& out, int64_t rows, int64_t K) {
  out.rows = rows;
  out.K = K;
  out.blocks = K / kBlock;
  out.q.resize(rows * K);
  out.scale.resize(rows * out.blocks);
  out.sum.resize(rows * out.blocks);
  out.isum.resize(rows * out.blocks);
  out.half_isum.resize(2 * rows * out.blocks);
}

// x's rows with room for their quantized blocks (filled by quantize_blocks).
inline PanelRows empty_rows(int64_t rows, int64_t K) {
  PanelRows out;
  resize_rows(out, rows, K);
  return out;
}

// Blocks [begin, end) of x (block e: row e / blocks, columns 32 (e % blocks) onward) quantized
// into out. Each block on its own, so any split over threads gives the same bytes.
template <typename T>
void quantize_blocks(const T* x, PanelRows& out, int64_t begin, int64_t end, int level) {
  float values[kBlock];
  for (int64_t e = begin; e < end; ++e) {
    const int64_t m = e / out.blocks, b = e % out.blocks;
    const T* src = x + m * out.K + b * kBlock;
    for (int i = 0; i < kBlock; ++i) values[i] = static_cast<float>(src[i]);
    int8_t* q = out.q.data() + m * out.K + b * kBlock;
    int32_t half_sum[2];
    float amax;
#if SPECDEC_X86
    if (level >= simd::kAvx512) {
      amax = qdot::quantize_block32_avx512(values, q, q + 16, half_sum);
    } else if (level >= simd::kAvx2) {
      amax = qdot::quantize_block32_avx2(values, q, q + 16, half_sum);
    } else {
      amax = qdot::quantize_block32_portable(values, q, q + 16, half_sum);
    }
#else
    (void)level;
    amax = qdot::quantize_block32_portable(values, q, q + 16, half_sum);
#endif
    const float scale = amax / 127.0f;
    out.scale[e] = scale;
    out.isum[e] = half_sum[0] + half_sum[1];
    out.half_isum[2 * e] = half_sum[0];
    out.half_isum[2 * e + 1] = half_sum[1];
    out.sum[e] = static_cast<float>(out.isum[e]) * scale;
  }
}

template <typename T>
PanelRows quantize_rows(const T* x, int64_t rows, int64_t K, int level) {
  PanelRows out = empty_rows(rows, K);
  quantize_blocks(x, out, 0, rows * out.blocks, level);
  return out;
}

// One quantized x row's data as the vector tiles read it, block by block.
struct RowData {
  const int32_t* q;     // the int8 values, 8 groups of 4 a block
  const float* scale;   // per block
  const float* sum;     // per block
  const int32_t* isum;  // per block
  const int32_t* half_isum;  // per block, 2

  RowData() = default;
  RowData(const PanelRows& x, int64_t m)
      : q(reinterpret_cast<const int32_t*>(x.q.data() + m * x.K)),
        scale(x.scale.data() + m * x.blocks),
        sum(x.sum.data() + m * x.blocks),
        isum(x.isum.data() + m * x.blocks),
        half_isum(x.half_isum.data() + 2 * m * x.blocks) {}
};

// The weights of one call.
template <typename S>
struct PanelWeights {
  const uint8_t* q;  // [panels, blocks, block_bytes]
  const S* scale;    // [panels, blocks, 16], or [panels, blocks, 32] in groups of 16
  const S* min;      // like scale, or nullptr (always in groups of 16)
  int64_t blocks;
};

// Scales per (panel, block): one per row, or one per row and half.
constexpr int scales_per_block(bool halves) { return halves ? 2 * 16 : 16; }

// The element type of K-quant scales as the file holds them (layout above).
struct KScale {
  int8_t raw;
};
constexpr int kSuperBlock = 8;  // blocks of 32 per K-quant super-block of 256 values

// Elements of S per (panel, block) of a panel's scales with `entries` a block: K-quant
// super-blocks hold 8 entries-wide blocks and 32 bytes of float16 super-scales.
template <typename S>
constexpr int64_t scale_stride(int entries) {
  return std::is_same_v<S, KScale> ? entries + 32 / kSuperBlock : entries;
}

// Entry i of block b's scales (or mins: negated products for K-quants) from a panel's start.
template <int kEntries, bool kMin, typename S>
inline float scale_at(const S* panel, int64_t b, int i) {
  if constexpr (std::is_same_v<S, KScale>) {
    const int8_t* super = &panel[(b / kSuperBlock) * kSuperBlock * scale_stride<S>(kEntries)].raw;
    c10::Half d;
    std::memcpy(&d, super + kSuperBlock * kEntries + 2 * (i % kPanelRows), sizeof(d));
    const float product = static_cast<float>(d) * static_cast<float>(super[(b % kSuperBlock) * kEntries + i]);
    return kMin ? -product : product;
  } else {
    return static_cast<float>(panel[b * kEntries + i]);
  }
}

// Rows m0 .. m0 + MR - 1 of x against panel p: out[m * ldo + r] for the panel's 16 rows.
template <typename S>
using PanelTileFn = void (*)(const PanelRows& x, int64_t m0, const PanelWeights<S>& w, int64_t p,
                             float* out, int64_t ldo);

// Operand j of a block meets x values 4 j' .. 4 j' + 3 with j' = x_group(j): int4 operands are
// the 4 vectors' low nibbles (values 4 j ..) then their high nibbles (values 16 + 4 j ..), which
// is x's K order; int8 operands are the 8 vectors in order.
// Weight value of row r for operand j, lane byte i, of one (panel, block).
template <bool kInt4>
inline int32_t panel_value(const uint8_t* v, int j, int r, int i) {
  if constexpr (kInt4) {
    const uint8_t byte = v[64 * (j % 4) + 4 * r + i];
    return j < 4 ? (byte & 0x0F) : (byte >> 4);
  } else {
    return static_cast<int8_t>(v[64 * j + 4 * r + i]);
  }
}

// ----------------------------------------------------------------------------- portable

template <typename S, int MR, bool kInt4, bool kHalves>
void panel_tile_portable(const PanelRows& x, int64_t m0, const PanelWeights<S>& w, int64_t p,
                         float* out, int64_t ldo) {
  constexpr int kScales = scales_per_block(kHalves);
  const uint8_t* wp = w.q + p * w.blocks * block_bytes(kInt4);
  const S* ws = w.scale + p * w.blocks * scale_stride<S>(kScales);
  const S* wm = w.min != nullptr ? w.min + p * w.blocks * scale_stride<S>(kPanelRows) : nullptr;
  for (int mi = 0; mi < MR; ++mi) {
    const int64_t m = m0 + mi;
    const int8_t* xq = x.q.data() + m * x.K;
    for (int r = 0; r < kPanelRows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < w.blocks; ++b) {
        const uint8_t* v = wp + b * block_bytes(kInt4);
        const int8_t* xb = xq + b * kBlock;
        const float xscale = x.scale[m * x.blocks + b];
        if constexpr (kHalves) {
          for (int h = 0; h < 2; ++h) {
            int32_t isum = 0;
            for (int j = 4 * h; j < 4 * h + 4; ++j)
              for (int i = 0; i < 4; ++i) isum += panel_value<kInt4>(v, j, r, i) * xb[4 * j + i];
            const float scale = scale_at<kScales, false>(ws, b, h * kPanelRows + r);
            acc = std::fma(static_cast<float>(isum), scale * xscale, acc);
          }
          continue;
        }
        int32_t isum = 0;
        for (int j = 0; j < kOperands; ++j)
          for (int i = 0; i < 4; ++i) isum += panel_value<kInt4>(v, j, r, i) * xb[4 * j + i];
        const float combined = scale_at<kScales, false>(ws, b, r) * xscale;
        acc = std::fma(static_cast<float>(isum), combined, acc);
        if (wm != nullptr) acc = std::fma(scale_at<kPanelRows, true>(wm, b, r), x.sum[m * x.blocks + b], acc);
      }
      out[mi * ldo + r] = acc;
    }
  }
}

#if SPECDEC_X86
// Each vector path holds a block's 8 weight operands in registers and, per x row, forms the
// 8 dot products against broadcast 4-byte groups of x in two chains (the products' latency in
// the shadow). The dot products take unsigned weights and signed x:
//   int4: the nibbles, 0..15, as they are;
//   int8 with VNNI: w + 128 (the sign bit flipped), and 128 * sum(x) taken off the integer sum
//     after (exact: vpdpbusd does not saturate);
//   int8 without VNNI: |w|, with x negated where w < 0 (vpmaddubsw's int16 pairs would
//     saturate on w + 128; |w| <= 128 and |x| <= 127 keep them below 2^15).
// Without VNNI, int4's 8 vpmaddubsw results are summed in int16 before the one vpmaddwd that
// widens them: a pair is at most 2 * 15 * 127 = 3810, 8 of them 30480 < 2^15, so the sums stay
// exact (and the bits those of VNNI) with 8 adds fewer per block and row.

// ----------------------------------------------------------------------------- AVX-512

SPECDEC_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_TARGET_AVX512 inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Entries i .. i + 15 of block b's scales (mins: kMin) from a panel's start, as scale_at.
template <int kEntries, bool kMin, typename S>
SPECDEC_TARGET_AVX512 inline __m512 scales16(const S* panel, int64_t b, int i) {
  if constexpr (std::is_same_v<S, KScale>) {
    const int8_t* super = &panel[(b / kSuperBlock) * kSuperBlock * scale_stride<S>(kEntries)].raw;
    const __m512 d = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + kSuperBlock * kEntries)));
    const __m128i sub = _mm_loadu_si128(reinterpret_cast<const __m128i*>(super + (b % kSuperBlock) * kEntries + i));
    const __m512 product = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sub)));
    return kMin ? _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(product),
                                                       _mm512_set1_epi32(static_cast<int>(0x80000000u))))
                : product;
  } else {
    return load16(panel + b * kEntries + i);
  }
}

// A block's 8 operands (and, for int8 without VNNI, where the weights are negative).
template <bool kInt4, bool kVnni>
struct Operands512 {
  __m512i w[kOperands];
  __mmask64 negative[kOperands];

  SPECDEC_TARGET_AVX512VNNI inline void load(const uint8_t* v) {
    if constexpr (kInt4) {
      const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = _mm512_loadu_si512(v + 64 * j);
        w[j] = _mm512_and_si512(raw, low4);
        w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
    } else {
#pragma GCC unroll 8
      for (int j = 0; j < kOperands; ++j) {
        const __m512i raw = _mm512_loadu_si512(v + 64 * j);
        if constexpr (kVnni) {
          w[j] = _mm512_xor_si512(raw, _mm512_set1_epi8(static_cast<char>(0x80)));
        } else {
          w[j] = _mm512_abs_epi8(raw);
          negative[j] = _mm512_movepi8_mask(raw);
        }
      }
    }
  }

  // The exact integer sums of 16 rows against x values q (8 groups of 4).
  SPECDEC_TARGET_AVX512VNNI inline __m512i dot(const int32_t* q, int32_t x_sum) const {
    if constexpr (kInt4 && !kVnni) {
      __m512i pairs[2];
#pragma GCC unroll 8
      for (int j = 0; j < kOperands; ++j) {
        const __m512i p = _mm512_maddubs_epi16(w[j], _mm512_set1_epi32(q[j]));
        pairs[j % 2] = j < 2 ? p : _mm512_add_epi16(pairs[j % 2], p);
      }
      return _mm512_madd_epi16(_mm512_add_epi16(pairs[0], pairs[1]), _mm512_set1_epi16(1));
    }
    __m512i chain[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
    for (int j = 0; j < kOperands; ++j) {
      if constexpr (kVnni) {
        // x's 4 bytes as the instruction's broadcast memory operand: no separate broadcast.
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(chain[j % 2]) : "v"(w[j]), "m"(q[j]));
        continue;
      }
      __m512i xv = _mm512_set1_epi32(q[j]);
      {
        if constexpr (!kInt4) xv = _mm512_mask_sub_epi8(xv, negative[j], _mm512_setzero_si512(), xv);
        chain[j % 2] = _mm512_add_epi32(
            chain[j % 2], _mm512_madd_epi16(_mm512_maddubs_epi16(w[j], xv), _mm512_set1_epi16(1)));
      }
    }
    __m512i sum = _mm512_add_epi32(chain[0], chain[1]);
    if constexpr (!kInt4 && kVnni) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * x_sum));
    return sum;
  }

  // int8 in groups of 16: the exact sums of the block's two halves (operands 0-3 and 4-7).
  SPECDEC_TARGET_AVX512VNNI inline void dot_halves(const int32_t* q, const int32_t* half_sums,
                                                   __m512i sums[2]) const {
    static_assert(!kInt4, "groups of 16 are int8");
    sums[0] = sums[1] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < kOperands; ++j) {
      if constexpr (kVnni) {
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(sums[j / 4]) : "v"(w[j]), "m"(q[j]));
      } else {
        const __m512i xv = _mm512_mask_sub_epi8(_mm512_set1_epi32(q[j]), negative[j],
                                                _mm512_setzero_si512(), _mm512_set1_epi32(q[j]));
        sums[j / 4] = _mm512_add_epi32(
            sums[j / 4], _mm512_madd_epi16(_mm512_maddubs_epi16(w[j], xv), _mm512_set1_epi16(1)));
      }
    }
    if constexpr (kVnni) {
      sums[0] = _mm512_sub_epi32(sums[0], _mm512_set1_epi32(128 * half_sums[0]));
      sums[1] = _mm512_sub_epi32(sums[1], _mm512_set1_epi32(128 * half_sums[1]));
    }
  }
};

template <typename S, int MR, bool kInt4, bool kVnni, bool kHalves>
SPECDEC_TARGET_AVX512VNNI void panel_tile_avx512(const PanelRows& x, int64_t m0,
                                                 const PanelWeights<S>& w, int64_t p, float* out,
                                                 int64_t ldo) {
  constexpr int kBytes = block_bytes(kInt4);
  constexpr int kScales = scales_per_block(kHalves);
  const int64_t blocks = w.blocks;
  const uint8_t* wp = w.q + p * blocks * kBytes;
  const S* ws = w.scale + p * blocks * scale_stride<S>(kScales);
  const S* wm = w.min != nullptr ? w.min + p * blocks * scale_stride<S>(kPanelRows) : nullptr;
  __m512 acc[MR];
  RowData row[MR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps(), row[m] = RowData(x, m0 + m);
  Operands512<kInt4, kVnni> operands;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* v = wp + b * kBytes;
#pragma GCC unroll 8
    for (int j = 0; j < kBytes / 64; ++j) __builtin_prefetch(v + kPrefetchBlocks * kBytes + 64 * j, 0, 3);
    operands.load(v);
    if constexpr (kHalves) {
      const __m512 scale0 = scales16<kScales, false>(ws, b, 0);
      const __m512 scale1 = scales16<kScales, false>(ws, b, kPanelRows);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        __m512i sums[2];
        operands.dot_halves(row[m].q + b * 8, row[m].half_isum + 2 * b, sums);
        const __m512 xscale = _mm512_set1_ps(row[m].scale[b]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[0]), _mm512_mul_ps(scale0, xscale), acc[m]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[1]), _mm512_mul_ps(scale1, xscale), acc[m]);
      }
      continue;
    }
    const __m512 scale = scales16<kScales, false>(ws, b, 0);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 isum = _mm512_cvtepi32_ps(operands.dot(row[m].q + b * 8, row[m].isum[b]));
      acc[m] = _mm512_fmadd_ps(isum, _mm512_mul_ps(scale, _mm512_set1_ps(row[m].scale[b])), acc[m]);
    }
    if (wm != nullptr) {
      const __m512 min = scales16<kPanelRows, true>(wm, b, 0);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m] = _mm512_fmadd_ps(min, _mm512_set1_ps(row[m].sum[b]), acc[m]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + m * ldo, acc[m]);
}

// ----------------------------------------------------------------------------- AVX2

SPECDEC_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_TARGET_AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Entries i .. i + 7 of block b's scales (mins: kMin) from a panel's start, as scale_at.
template <int kEntries, bool kMin, typename S>
SPECDEC_TARGET_AVX2 inline __m256 scales8(const S* panel, int64_t b, int i) {
  if constexpr (std::is_same_v<S, KScale>) {
    const int8_t* super = &panel[(b / kSuperBlock) * kSuperBlock * scale_stride<S>(kEntries)].raw;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(super + kSuperBlock * kEntries + 2 * (i % kPanelRows))));
    const __m128i sub = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(super + (b % kSuperBlock) * kEntries + i));
    const __m256 product = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sub)));
    return kMin ? _mm256_xor_ps(product, _mm256_set1_ps(-0.0f)) : product;
  } else {
    return load8(panel + b * kEntries + i);
  }
}

// One half of a panel's block (rows 8 h .. 8 h + 7: bytes 32 h .. 32 h + 31 of each vector).
template <bool kInt4, bool kVnni>
struct Operands256 {
  __m256i w[kOperands];
  __m256i sign[kOperands];  // int8 without VNNI: the raw weights, for _mm256_sign_epi8

  SPECDEC_TARGET_AVX2_VNNI inline void load(const uint8_t* v) {
    if constexpr (kInt4) {
      const __m256i low4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 64 * j));
        w[j] = _mm256_and_si256(raw, low4);
        w[4 + j] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
    } else {
#pragma GCC unroll 8
      for (int j = 0; j < kOperands; ++j) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 64 * j));
        if constexpr (kVnni) {
          w[j] = _mm256_xor_si256(raw, _mm256_set1_epi8(static_cast<char>(0x80)));
        } else {
          w[j] = _mm256_abs_epi8(raw);
          sign[j] = raw;
        }
      }
    }
  }

  SPECDEC_TARGET_AVX2_VNNI inline __m256i dot(const int32_t* q, int32_t x_sum) const {
    if constexpr (kInt4 && !kVnni) {
      __m256i pairs[2];
#pragma GCC unroll 8
      for (int j = 0; j < kOperands; ++j) {
        const __m256i p = _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(q[j]));
        pairs[j % 2] = j < 2 ? p : _mm256_add_epi16(pairs[j % 2], p);
      }
      return _mm256_madd_epi16(_mm256_add_epi16(pairs[0], pairs[1]), _mm256_set1_epi16(1));
    }
    __m256i chain[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int j = 0; j < kOperands; ++j) {
      __m256i xv = _mm256_set1_epi32(q[j]);
      if constexpr (kVnni) {
        chain[j % 2] = _mm256_dpbusd_avx_epi32(chain[j % 2], w[j], xv);
      } else {
        if constexpr (!kInt4) xv = _mm256_sign_epi8(xv, sign[j]);
        chain[j % 2] = _mm256_add_epi32(
            chain[j % 2], _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], xv), _mm256_set1_epi16(1)));
      }
    }
    __m256i sum = _mm256_add_epi32(chain[0], chain[1]);
    if constexpr (!kInt4 && kVnni) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(128 * x_sum));
    return sum;
  }

  // int8 in groups of 16: the exact sums of the block's two halves (operands 0-3 and 4-7).
  SPECDEC_TARGET_AVX2_VNNI inline void dot_halves(const int32_t* q, const int32_t* half_sums,
                                                  __m256i sums[2]) const {
    static_assert(!kInt4, "groups of 16 are int8");
    sums[0] = sums[1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < kOperands; ++j) {
      __m256i xv = _mm256_set1_epi32(q[j]);
      if constexpr (kVnni) {
        sums[j / 4] = _mm256_dpbusd_avx_epi32(sums[j / 4], w[j], xv);
      } else {
        xv = _mm256_sign_epi8(xv, sign[j]);
        sums[j / 4] = _mm256_add_epi32(
            sums[j / 4], _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], xv), _mm256_set1_epi16(1)));
      }
    }
    if constexpr (kVnni) {
      sums[0] = _mm256_sub_epi32(sums[0], _mm256_set1_epi32(128 * half_sums[0]));
      sums[1] = _mm256_sub_epi32(sums[1], _mm256_set1_epi32(128 * half_sums[1]));
    }
  }
};

template <typename S, int MR, bool kInt4, bool kVnni, bool kHalves>
SPECDEC_TARGET_AVX2_VNNI void panel_half_avx2(const PanelRows& x, int64_t m0, const PanelWeights<S>& w,
                                              int64_t p, int h, float* out, int64_t ldo) {
  constexpr int kBytes = block_bytes(kInt4);
  constexpr int kScales = scales_per_block(kHalves);
  const int64_t blocks = w.blocks;
  const uint8_t* wp = w.q + p * blocks * kBytes + 32 * h;
  const S* ws = w.scale + p * blocks * scale_stride<S>(kScales);
  const S* wm = w.min != nullptr ? w.min + p * blocks * scale_stride<S>(kPanelRows) : nullptr;
  __m256 acc[MR];
  RowData row[MR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps(), row[m] = RowData(x, m0 + m);
  Operands256<kInt4, kVnni> operands;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* v = wp + b * kBytes;
#pragma GCC unroll 8
    for (int j = 0; j < kBytes / 64; ++j) __builtin_prefetch(v + kPrefetchBlocks * kBytes + 64 * j, 0, 3);
    operands.load(v);
    if constexpr (kHalves) {
      const __m256 scale0 = scales8<kScales, false>(ws, b, 8 * h);
      const __m256 scale1 = scales8<kScales, false>(ws, b, kPanelRows + 8 * h);
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        __m256i sums[2];
        operands.dot_halves(row[m].q + b * 8, row[m].half_isum + 2 * b, sums);
        const __m256 xscale = _mm256_set1_ps(row[m].scale[b]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[0]), _mm256_mul_ps(scale0, xscale), acc[m]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[1]), _mm256_mul_ps(scale1, xscale), acc[m]);
      }
      continue;
    }
    const __m256 scale = scales8<kScales, false>(ws, b, 8 * h);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m256 isum = _mm256_cvtepi32_ps(operands.dot(row[m].q + b * 8, row[m].isum[b]));
      acc[m] = _mm256_fmadd_ps(isum, _mm256_mul_ps(scale, _mm256_set1_ps(row[m].scale[b])), acc[m]);
    }
    if (wm != nullptr) {
      const __m256 min = scales8<kPanelRows, true>(wm, b, 8 * h);
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) acc[m] = _mm256_fmadd_ps(min, _mm256_set1_ps(row[m].sum[b]), acc[m]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + m * ldo + 8 * h, acc[m]);
}

template <typename S, int MR, bool kInt4, bool kVnni, bool kHalves>
void panel_tile_avx2(const PanelRows& x, int64_t m0, const PanelWeights<S>& w, int64_t p, float* out,
                     int64_t ldo) {
  panel_half_avx2<S, MR, kInt4, kVnni, kHalves>(x, m0, w, p, 0, out, ldo);
  panel_half_avx2<S, MR, kInt4, kVnni, kHalves>(x, m0, w, p, 1, out, ldo);
}
#endif  // SPECDEC_X86

// ----------------------------------------------------------------------------- tile tables

// Rows per tile: AVX-512 holds 8 accumulators beside the 8 weight operands (32 registers);
// AVX2 and the portable code 4.
constexpr int kMaxTileRows = 8;

template <typename S>
struct PanelTiles {
  PanelTileFn<S> table[kMaxTileRows] = {};
  int rows = 1;  // the largest tile
};

template <typename S, template <int> class Kernel, int... MR>
PanelTiles<S> make_tiles(std::integer_sequence<int, MR...>) {
  PanelTiles<S> t;
  ((t.table[MR] = Kernel<MR + 1>::fn), ...);
  t.rows = static_cast<int>(sizeof...(MR));
  return t;
}

template <typename S, bool kInt4, bool kHalves>
struct PortableP {
  template <int MR>
  struct K {
    static constexpr PanelTileFn<S> fn = &panel_tile_portable<S, MR, kInt4, kHalves>;
  };
};

#if SPECDEC_X86
template <typename S, bool kInt4, bool kVnni, bool kHalves>
struct Avx512P {
  template <int MR>
  struct K {
    static constexpr PanelTileFn<S> fn = &panel_tile_avx512<S, MR, kInt4, kVnni, kHalves>;
  };
};

template <typename S, bool kInt4, bool kVnni, bool kHalves>
struct Avx2P {
  template <int MR>
  struct K {
    static constexpr PanelTileFn<S> fn = &panel_tile_avx2<S, MR, kInt4, kVnni, kHalves>;
  };
};
#endif

// The tiles of the best instruction set allowed (all give the same bits); kHalves: int8 in
// groups of 16.
template <typename S, bool kInt4, bool kHalves = false>
const PanelTiles<S>& tiles_for(int level) {
  static_assert(!(kInt4 && kHalves), "groups of 16 are int8");
  static const PanelTiles<S> portable =
      make_tiles<S, PortableP<S, kInt4, kHalves>::template K>(std::make_integer_sequence<int, 4>{});
#if SPECDEC_X86
  static const PanelTiles<S> avx2 =
      make_tiles<S, Avx2P<S, kInt4, false, kHalves>::template K>(std::make_integer_sequence<int, 4>{});
  static const PanelTiles<S> avx2_vnni =
      make_tiles<S, Avx2P<S, kInt4, true, kHalves>::template K>(std::make_integer_sequence<int, 4>{});
  static const PanelTiles<S> avx512 =
      make_tiles<S, Avx512P<S, kInt4, false, kHalves>::template K>(std::make_integer_sequence<int, kMaxTileRows>{});
  static const PanelTiles<S> avx512_vnni =
      make_tiles<S, Avx512P<S, kInt4, true, kHalves>::template K>(std::make_integer_sequence<int, kMaxTileRows>{});
  if (level >= simd::kAvx512) return qdot::has_avx512_vnni() ? avx512_vnni : avx512;
  if (level >= simd::kAvx2) return qdot::has_avx_vnni() ? avx2_vnni : avx2;
#endif
  (void)level;
  return portable;
}

}  // namespace qpanel
}  // namespace specdec
