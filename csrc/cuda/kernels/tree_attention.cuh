// Tree attention CUDA kernels (FlashAttention-2 structure, flash-decoding splits). No torch
// includes.
//
// Work split: one CTA per (request b, KV head h, block of query rows, key split). The query rows
// of a KV head are all (tree token t, query head of the group g) pairs, row = t * G + g, so one
// K/V tile in shared memory serves every tree token and every query head of the group. The keys
// of request b (its cache_lens[b] prefix rows, then its T tree rows) are cut into num_splits
// ranges of whole key tiles, sized per request on the device from cache_lens[b] (so the grid
// depends on shapes only: no host copy of the lengths, and graph capture needs nothing special).
// Each CTA runs an online softmax over its range; with several splits it writes a normalised
// partial output and its log-sum-exp, which tree_attention_combine_kernel merges. Softmax runs
// in the log2 domain (scores multiplied by scale * log2(e)) in fp32. A row that sees no key is 0.
//
// Two main kernels share that structure:
// - tree_attention_mma_kernel: fp16/bf16, head dim a multiple of 8 up to 256, 16-byte aligned
//   rows, sm_80+. Instantiated for head dims 64/80/96/128/256; another head dim runs on the next
//   larger instantiation with its extra columns zero-filled. Q and double-buffered K/V tiles
//   arrive in shared memory by cp.async; each warp owns 16 * kMTiles query rows, keeps its S/P
//   tile and O accumulators in registers (mma.sync m16n8k16, fp32 accumulation, P re-used from
//   the S accumulators as the A operand of P V) and reads K/V through ldmatrix.
// - tree_attention_simt_kernel: everything else (fp32, unaligned views, odd head dims); 16 query
//   rows by 32 keys per tile, a lane per key for Q K^T, a lane per dim for P V.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/common.h"
#include "core/tree.h"
#include "cuda/kernels/warp_mma.cuh"

namespace specdec {

constexpr int kTreeAttentionThreads = 128;  // 4 warps, every main kernel
constexpr int kMaxCudaHeadDim = 256;
constexpr int kSimtRowsPerWarp = 4;
constexpr int kSimtRows = 4 * kSimtRowsPerWarp;  // query rows per CTA
constexpr int kSimtKeys = 32;                    // keys per tile: one per lane
constexpr int kMaxTreeAttentionSplits = 256;

template <typename scalar_t>
struct TreeAttentionParams {
  const scalar_t* q;           // [B, T, Hq, D], strides below
  const scalar_t* k;           // [B, Hkv, S, D], strides below
  const scalar_t* v;
  scalar_t* out;               // [B, T, Hq, D] contiguous
  const void* cache_lens;      // [B] int32 or int64 (lens_are_int64)
  const int32_t* tree_mask;    // [B, T, words]
  float* partial_out;          // [B, T, Hq, num_splits, D] when num_splits > 1
  float* partial_lse;          // [B, T, Hq, num_splits], log2 domain, -inf when nothing seen
  int64_t q_stride_b, q_stride_t, q_stride_h;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t capacity;            // S
  int batch, tokens, q_heads, kv_heads, group, head_dim, words;
  int num_splits, row_blocks;
  int key_tile;                // keys per tile of the main kernel: splits are whole tiles
  int lens_are_int64;
  float scale_log2;            // softmax scale * log2(e)
};

// ------------------------------------------------------------------------- key splits

// Keys [begin, end) of one split of a request: its cache_len + T keys are cut into num_splits
// ranges of equally many whole key tiles (the last ones may be short or empty).
struct KeySplit {
  int64_t begin, end;
};

SPECDEC_HD int64_t tiles_per_split(int64_t num_keys, int key_tile, int num_splits) {
  return ceil_div<int64_t>(ceil_div<int64_t>(num_keys, key_tile), num_splits);
}

SPECDEC_HD KeySplit key_split(int64_t num_keys, int key_tile, int num_splits, int split) {
  const int64_t keys_per_split = tiles_per_split(num_keys, key_tile, num_splits) * key_tile;
  const int64_t begin = split * keys_per_split;
  const int64_t end = begin + keys_per_split < num_keys ? begin + keys_per_split : num_keys;
  return {begin, end};
}

// Splits of a request that hold at least one key (the combine reads only those).
SPECDEC_HD int64_t used_splits(int64_t num_keys, int key_tile, int num_splits) {
  return ceil_div<int64_t>(ceil_div<int64_t>(num_keys, key_tile),
                           tiles_per_split(num_keys, key_tile, num_splits));
}

// ------------------------------------------------------------------------- tile shapes

// Shape of the tensor-core kernel for one head-dim instantiation and kMTiles m16 tiles per warp.
template <int kHeadDim, int kMTiles>
struct MmaTileConfig {
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= kMaxCudaHeadDim, "head dim tile");
  static constexpr int kWarps = kTreeAttentionThreads / 32;
  static constexpr int kRows = 16 * kMTiles * kWarps;  // query rows per CTA
  static constexpr int kKeys = kHeadDim > 128 || kMTiles > 1 ? 32 : 64;  // keys per tile
  // Shared rows are padded by 16 bytes: the 8 rows an ldmatrix reads (row pitch (D + 8) * 2
  // bytes, D a multiple of 16) then start in 8 distinct groups of 4 banks, so no conflicts.
  static constexpr int kLd = kHeadDim + 8;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kQElems = kRows * kLd;
  static constexpr int kStageElems = kKeys * kLd;  // one K or V tile
  static constexpr int kSmemBytes = (kQElems + 4 * kStageElems) * 2;  // Q, 2 stages of K and V
};

// The head-dim instantiation a head dim runs on (0: not on tensor cores).
constexpr int mma_tile_dim(int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > kMaxCudaHeadDim) return 0;
  return head_dim <= 64 ? 64 : head_dim <= 80 ? 80 : head_dim <= 96 ? 96 : head_dim <= 128 ? 128 : 256;
}

// Two m16 tiles per warp (128 rows per CTA) halve the shared-memory reads per MMA; worth it
// when a KV head has more than 64 query rows and the accumulators fit in registers (D <= 128).
constexpr int mma_m_tiles(int tile_dim, int64_t rows) { return rows > 64 && tile_dim <= 128 ? 2 : 1; }

// Calls f(integral_constant<int, D>, integral_constant<int, M>) for an instantiated shape.
template <typename F>
void dispatch_mma_tile(int tile_dim, int m_tiles, F&& f) {
  using std::integral_constant;
  if (m_tiles == 2) {
    switch (tile_dim) {
      case 64: return f(integral_constant<int, 64>{}, integral_constant<int, 2>{});
      case 80: return f(integral_constant<int, 80>{}, integral_constant<int, 2>{});
      case 96: return f(integral_constant<int, 96>{}, integral_constant<int, 2>{});
      default: return f(integral_constant<int, 128>{}, integral_constant<int, 2>{});
    }
  }
  switch (tile_dim) {
    case 64: return f(integral_constant<int, 64>{}, integral_constant<int, 1>{});
    case 80: return f(integral_constant<int, 80>{}, integral_constant<int, 1>{});
    case 96: return f(integral_constant<int, 96>{}, integral_constant<int, 1>{});
    case 128: return f(integral_constant<int, 128>{}, integral_constant<int, 1>{});
    default: return f(integral_constant<int, 256>{}, integral_constant<int, 1>{});
  }
}

// Shared memory of the SIMT kernel, in floats.
SPECDEC_HD int64_t simt_smem_floats(int64_t head_dim) {
  return 2 * kSimtRows * head_dim        // Q (scaled) and O accumulators
         + kSimtKeys * (head_dim + 1)    // K tile, padded against bank conflicts
         + kSimtKeys * head_dim          // V tile
         + 4 * kSimtKeys;                // P of each warp
}

// Splits per request so that the grid fills the device without a second, mostly idle wave:
// as many as fit in one wave when base_ctas (CTAs per split) is below a wave; else the fewest
// whose last wave is well filled (within 85% of the best tail efficiency over 1..16 splits).
// max_tiles bounds the key tiles of any request (from the cache capacity).
inline int choose_tree_attention_splits(int64_t base_ctas, int64_t wave_ctas, int64_t max_tiles) {
  const int64_t limit = max_tiles < kMaxTreeAttentionSplits ? max_tiles : kMaxTreeAttentionSplits;
  if (base_ctas <= 0 || wave_ctas <= 0 || limit <= 1) return 1;
  if (base_ctas <= wave_ctas) {
    const int64_t fit = wave_ctas / base_ctas;
    return static_cast<int>(fit < limit ? fit : limit);
  }
  auto efficiency = [&](int64_t s) {
    const double waves = static_cast<double>(base_ctas * s) / static_cast<double>(wave_ctas);
    return waves / static_cast<double>(ceil_div<int64_t>(base_ctas * s, wave_ctas));
  };
  const int64_t candidates = limit < 16 ? limit : 16;
  double best = 0.0;
  for (int64_t s = 1; s <= candidates; ++s) best = efficiency(s) > best ? efficiency(s) : best;
  for (int64_t s = 1; s <= candidates; ++s)
    if (efficiency(s) >= 0.85 * best) return static_cast<int>(s);
  return 1;
}

#if defined(SPECDEC_DEVICE_CODE)

template <typename T>
struct FloatConvert;
template <>
struct FloatConvert<float> {
  static SPECDEC_DEVICE float to(float x) { return x; }
  static SPECDEC_DEVICE float from(float x) { return x; }
};
template <>
struct FloatConvert<__half> {
  static SPECDEC_DEVICE float to(__half x) { return __half2float(x); }
  static SPECDEC_DEVICE __half from(float x) { return __float2half_rn(x); }
};
template <>
struct FloatConvert<__nv_bfloat16> {
  static SPECDEC_DEVICE float to(__nv_bfloat16 x) { return __bfloat162float(x); }
  static SPECDEC_DEVICE __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};

SPECDEC_DEVICE float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

SPECDEC_DEVICE float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// cache_lens[b], clamped into the cache so that an unchecked call can never read outside it.
template <typename P>
SPECDEC_DEVICE int64_t request_cache_len(const P& p, int64_t b) {
  const int64_t n = p.lens_are_int64 ? static_cast<const int64_t*>(p.cache_lens)[b]
                                     : static_cast<int64_t>(static_cast<const int32_t*>(p.cache_lens)[b]);
  const int64_t most = p.capacity - p.tokens;
  return n < 0 ? 0 : (n > most ? most : n);
}

// What one CTA works on: blockIdx.x = (b * Hkv + h) * row_blocks + row block, blockIdx.y = split.
struct TreeAttentionWork {
  int b, h, row_block;
  int64_t cache_len;
  KeySplit keys;
};

template <typename P>
SPECDEC_DEVICE TreeAttentionWork tree_attention_work(const P& p) {
  TreeAttentionWork w;
  const int block = static_cast<int>(blockIdx.x);
  w.row_block = block % p.row_blocks;
  const int bh = block / p.row_blocks;
  w.h = bh % p.kv_heads;
  w.b = bh / p.kv_heads;
  w.cache_len = request_cache_len(p, w.b);
  w.keys = key_split(w.cache_len + p.tokens, p.key_tile, p.num_splits, static_cast<int>(blockIdx.y));
  return w;
}

// Output row index (b, t, query head) into out / partial_out.
template <typename P>
SPECDEC_DEVICE int64_t tree_output_row(const P& p, int64_t b, int64_t row, int64_t h) {
  const int64_t t = row / p.group;
  return (b * p.tokens + t) * p.q_heads + h * p.group + row % p.group;
}

// Stores one element of a row's result: the final output when there is one split, else the
// normalised partial output (the log-sum-exp is stored separately).
template <typename scalar_t, typename P>
SPECDEC_DEVICE void store_tree_row(const P& p, int64_t out_row, int64_t split, int d, float value) {
  if (p.num_splits == 1) {
    p.out[out_row * p.head_dim + d] = FloatConvert<scalar_t>::from(value);
  } else {
    p.partial_out[(out_row * p.num_splits + split) * p.head_dim + d] = value;
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kTreeAttentionThreads)
    tree_attention_simt_kernel(const TreeAttentionParams<scalar_t> p) {
  SPECDEC_EXTERN_SHARED(unsigned char, simt_smem);
  using Conv = FloatConvert<scalar_t>;
  const TreeAttentionWork w = tree_attention_work(p);
  if (w.keys.begin >= w.keys.end) return;  // past this request's keys; the combine skips it
  const int dim = p.head_dim;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t total_rows = static_cast<int64_t>(p.tokens) * p.group;
  const int64_t row0 = w.row_block * kSimtRows;

  float* s_q = reinterpret_cast<float*>(simt_smem);
  float* s_o = s_q + kSimtRows * dim;
  float* s_k = s_o + kSimtRows * dim;
  float* s_v = s_k + kSimtKeys * (dim + 1);
  float* s_p = s_v + kSimtKeys * dim + warp * kSimtKeys;

  for (int i = threadIdx.x; i < kSimtRows * dim; i += blockDim.x) {
    const int64_t row = row0 + i / dim;
    const int d = i % dim;
    float value = 0.f;
    if (row < total_rows) {
      const int64_t t = row / p.group;
      const int64_t head = w.h * p.group + row % p.group;
      value = Conv::to(p.q[w.b * p.q_stride_b + t * p.q_stride_t + head * p.q_stride_h + d]) *
              p.scale_log2;
    }
    s_q[i] = value;
    s_o[i] = 0.f;
  }
  float row_max[kSimtRowsPerWarp], row_sum[kSimtRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
    row_max[rr] = -INFINITY;
    row_sum[rr] = 0.f;
  }
  __syncthreads();

  const scalar_t* k_base = p.k + w.b * p.k_stride_b + w.h * p.k_stride_h;
  const scalar_t* v_base = p.v + w.b * p.v_stride_b + w.h * p.v_stride_h;
  for (int64_t tile0 = w.keys.begin; tile0 < w.keys.end; tile0 += kSimtKeys) {
    const int num =
        static_cast<int>(w.keys.end - tile0 < kSimtKeys ? w.keys.end - tile0 : kSimtKeys);
    for (int i = threadIdx.x; i < kSimtKeys * dim; i += blockDim.x) {
      const int key = i / dim;
      const int d = i % dim;
      float kv = 0.f, vv = 0.f;
      if (key < num) {
        kv = Conv::to(k_base[(tile0 + key) * p.k_stride_s + d]);
        vv = Conv::to(v_base[(tile0 + key) * p.v_stride_s + d]);
      }
      s_k[key * (dim + 1) + d] = kv;
      s_v[key * dim + d] = vv;
    }
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
      const int r = warp * kSimtRowsPerWarp + rr;
      const int64_t row = row0 + r;
      if (row >= total_rows) continue;  // warp-uniform
      const int32_t* bits = p.tree_mask + (static_cast<int64_t>(w.b) * p.tokens + row / p.group) * p.words;
      float score = -INFINITY;
      if (lane < num && tree_key_visible(bits, tile0 + lane, w.cache_len)) {
        const float* qr = s_q + r * dim;
        const float* kr = s_k + lane * (dim + 1);
        float dot = 0.f;
        for (int d = 0; d < dim; ++d) dot = fmaf(qr[d], kr[d], dot);
        score = dot;
      }
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;  // nothing visible to this row in this tile
      const float new_max = fmaxf(row_max[rr], tile_max);
      const float rescale = exp2f(row_max[rr] - new_max);
      const float prob = score == -INFINITY ? 0.f : exp2f(score - new_max);
      row_sum[rr] = row_sum[rr] * rescale + warp_sum(prob);
      row_max[rr] = new_max;
      s_p[lane] = prob;
      __syncwarp();
      for (int d = lane; d < dim; d += 32) {
        float acc = s_o[r * dim + d] * rescale;
        for (int j = 0; j < num; ++j) acc = fmaf(s_p[j], s_v[j * dim + d], acc);
        s_o[r * dim + d] = acc;
      }
      __syncwarp();
    }
    __syncthreads();
  }

#pragma unroll
  for (int rr = 0; rr < kSimtRowsPerWarp; ++rr) {
    const int r = warp * kSimtRowsPerWarp + rr;
    const int64_t row = row0 + r;
    if (row >= total_rows) continue;
    const int64_t out_row = tree_output_row(p, w.b, row, w.h);
    const float inv = row_sum[rr] > 0.f ? 1.f / row_sum[rr] : 0.f;
    for (int d = lane; d < dim; d += 32)
      store_tree_row<scalar_t>(p, out_row, blockIdx.y, d, s_o[r * dim + d] * inv);
    if (p.num_splits > 1 && lane == 0) {
      p.partial_lse[out_row * p.num_splits + blockIdx.y] =
          row_sum[rr] > 0.f ? row_max[rr] + log2f(row_sum[rr]) : -INFINITY;
    }
  }
}

// Tensor-core kernel: 4 warps, warp w owns query rows [w * 16 * kMTiles, (w + 1) * 16 * kMTiles)
// of the CTA's block. Per key tile: S = Q K^T (A = Q by ldmatrix, B = K by ldmatrix), the online
// softmax on the S accumulators, O += P V (A = P repacked from S, B = V by ldmatrix.trans), while
// the next tile's K/V is already on its way (cp.async, two stages).
template <typename scalar_t, int kHeadDim, int kMTiles>
__global__ void __launch_bounds__(kTreeAttentionThreads, 2)
    tree_attention_mma_kernel(const TreeAttentionParams<scalar_t> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the launcher only selects this kernel on sm_80 and newer
#else
  using C = MmaTileConfig<kHeadDim, kMTiles>;
  constexpr int kKeys = C::kKeys;
  constexpr int kLd = C::kLd;
  constexpr int kDimTiles = kHeadDim / 8;  // n8 tiles of O
  constexpr int kKeyTiles = kKeys / 8;     // n8 tiles of S
  SPECDEC_EXTERN_SHARED(unsigned char, mma_smem);
  scalar_t* s_q = reinterpret_cast<scalar_t*>(mma_smem);
  scalar_t* s_k = s_q + C::kQElems;      // stages 0, 1
  scalar_t* s_v = s_k + 2 * C::kStageElems;

  const TreeAttentionWork w = tree_attention_work(p);
  if (w.keys.begin >= w.keys.end) return;  // past this request's keys; the combine skips it
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int total_rows = p.tokens * p.group;
  const int row0 = w.row_block * C::kRows;
  // The split in 32-bit offsets from its first key: its length, and where the tree starts
  // (clamped into [-T, split_len]; keys before it are the prefix, visible to every row).
  const int split_len = static_cast<int>(w.keys.end - w.keys.begin);
  const int64_t tree_from_split = w.cache_len - w.keys.begin;
  const int tree_start = static_cast<int>(tree_from_split < split_len ? tree_from_split : split_len);
  const int num_tiles = (split_len + kKeys - 1) / kKeys;
  const int unmasked_tiles = tree_start > 0 ? tree_start / kKeys : 0;  // tiles of prefix keys only
  const scalar_t* k_split = p.k + w.b * p.k_stride_b + w.h * p.k_stride_h + w.keys.begin * p.k_stride_s;
  const scalar_t* v_split = p.v + w.b * p.v_stride_b + w.h * p.v_stride_h + w.keys.begin * p.v_stride_s;

  // Q rows of the block; rows past T * G and columns past the head dim are zero-filled.
  for (int i = tid; i < C::kRows * C::kChunks; i += kTreeAttentionThreads) {
    const int r = i / C::kChunks;
    const int c = i % C::kChunks;
    const int row = row0 + r;
    const bool valid = row < total_rows && c * 8 < p.head_dim;
    const scalar_t* src = p.q;  // not read when !valid
    if (valid) {
      src = p.q + w.b * p.q_stride_b + static_cast<int64_t>(row / p.group) * p.q_stride_t +
            (w.h * p.group + row % p.group) * p.q_stride_h + c * 8;
    }
    cp_async_16(s_q + r * kLd + c * 8, src, valid);
  }
  // K and V of key tile `tile` into `stage`; keys past the split (the next split's, the tail,
  // or past the cache) are zero-filled, so masked products are 0 * 0, never 0 * garbage.
  auto load_tile = [&](int tile, int stage) {
    scalar_t* dst_k = s_k + stage * C::kStageElems;
    scalar_t* dst_v = s_v + stage * C::kStageElems;
    for (int i = tid; i < kKeys * C::kChunks; i += kTreeAttentionThreads) {
      const int key = tile * kKeys + i / C::kChunks;
      const int c = i % C::kChunks;
      const int local = i / C::kChunks * kLd + c * 8;
      const bool valid = key < split_len && c * 8 < p.head_dim;
      const int64_t k_offset = valid ? key * p.k_stride_s + c * 8 : 0;
      const int64_t v_offset = valid ? key * p.v_stride_s + c * 8 : 0;
      cp_async_16(dst_k + local, k_split + k_offset, valid);
      cp_async_16(dst_v + local, v_split + v_offset, valid);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  // This thread's rows: g and g + 8 of each of its m16 tiles (hf = 0, 1).
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int warp_row0 = warp * 16 * kMTiles;
  float o[kMTiles][kDimTiles][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][d][e] = 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row_max[mt][hf] = -INFINITY;
      row_sum[mt][hf] = 0.f;
    }
  }
  // ldmatrix row/column of this lane: A operands (Q, and V read transposed) take matrices in
  // the order (rows 0-7, 8-15) x (cols 0-7, 8-15) row-fastest; K as B takes keys 0-7 / 8-15
  // (two n8 tiles) with dims 0-7 / 8-15 (the fragment's two registers) dim-fastest.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_col = (lane >> 4) * 8;
  const int k_row = (lane & 7) + (lane >> 4) * 8;
  const int k_col = ((lane >> 3) & 1) * 8;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < num_tiles) {
      load_tile(tile + 1, stage ^ 1);  // that stage was last read in iteration tile - 1
      cp_async_commit();
      cp_async_wait<1>();  // everything but the tile just issued has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const scalar_t* tile_k = s_k + stage * C::kStageElems;
    const scalar_t* tile_v = s_v + stage * C::kStageElems;

    // S = Q K^T over the tile.
    float s[kMTiles][kKeyTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldmatrix_x4(a[mt], s_q + (warp_row0 + mt * 16 + a_row) * kLd + kk * 16 + a_col);
#pragma unroll
      for (int jj = 0; jj < kKeys / 16; ++jj) {
        uint32_t bk[4];
        ldmatrix_x4(bk, tile_k + (jj * 16 + k_row) * kLd + kk * 16 + k_col);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<scalar_t>(s[mt][2 * jj], a[mt], bk[0], bk[1]);
          mma_16816<scalar_t>(s[mt][2 * jj + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // Online softmax on the accumulators: element e of n8 tile j is row g + 8 (e / 2), key
    // 8 j + 2 t4 + (e % 2) of the tile; a row's 4 lanes (same g) combine with xor 1 and 2.
    // Tiles of prefix keys only skip the mask; in the others key i of the tile is visible iff
    // i < end (in the split) and (i < tree (prefix) or bit i - tree of the row's mask).
    const bool masked = tile >= unmasked_tiles;
    const int end = split_len - tile * kKeys;
    const int tree = tree_start - tile * kKeys;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int32_t* mask_row = nullptr;
        if (masked) {
          const int row = row0 + warp_row0 + mt * 16 + g + 8 * hf;
          const int token = row < total_rows ? row / p.group : 0;  // padding rows: any row
          mask_row = p.tree_mask + (static_cast<int64_t>(w.b) * p.tokens + token) * p.words;
        }
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[mt][j][2 * hf + e] * p.scale_log2;
            if (masked) {
              const int i = 8 * j + 2 * t4 + e;
              if (!(i < end && (i < tree || tree_mask_bit(mask_row, i - tree)))) x = -INFINITY;
            }
            s[mt][j][2 * hf + e] = x;
            tile_max = fmaxf(tile_max, x);
          }
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[mt][hf], tile_max);
        // Nothing seen yet: subtract 0, so exp2(-inf) = 0 everywhere and no inf - inf.
        const float base = new_max == -INFINITY ? 0.f : new_max;
        const float rescale = exp2f(row_max[mt][hf] - base);
        row_max[mt][hf] = new_max;
        float tile_sum = 0.f;  // this lane's share; the row's 4 lanes are added at the end
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float prob = exp2f(s[mt][j][2 * hf + e] - base);
            s[mt][j][2 * hf + e] = prob;
            tile_sum += prob;
          }
        }
        row_sum[mt][hf] = row_sum[mt][hf] * rescale + tile_sum;
#pragma unroll
        for (int d = 0; d < kDimTiles; ++d) {
          o[mt][d][2 * hf] *= rescale;
          o[mt][d][2 * hf + 1] *= rescale;
        }
      }
    }

    // O += P V: P's A fragment for keys 16 kk .. 16 kk + 15 is S tiles 2 kk and 2 kk + 1.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = pack_pair<scalar_t>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack_pair<scalar_t>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack_pair<scalar_t>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_pair<scalar_t>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dd = 0; dd < kHeadDim / 16; ++dd) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, tile_v + (kk * 16 + a_row) * kLd + dd * 16 + a_col);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<scalar_t>(o[mt][2 * dd], pa[mt], bv[0], bv[1]);
          mma_16816<scalar_t>(o[mt][2 * dd + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Epilogue: the row sums of the 4 lanes of a row, then this lane's columns 8 d + 2 t4, +1.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = row_sum[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + warp_row0 + mt * 16 + g + 8 * hf;
      if (row >= total_rows) continue;  // no collectives below
      const int64_t out_row = tree_output_row(p, w.b, row, w.h);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) {
        const int col = 8 * d + 2 * t4;
        if (col >= p.head_dim) continue;  // zero-filled columns of a padded head dim
        const float x0 = o[mt][d][2 * hf] * inv;
        const float x1 = o[mt][d][2 * hf + 1] * inv;
        if (p.num_splits == 1) {
          *reinterpret_cast<uint32_t*>(p.out + out_row * p.head_dim + col) =
              pack_pair<scalar_t>(x0, x1);
        } else {
          float* dst = p.partial_out + (out_row * p.num_splits + blockIdx.y) * p.head_dim + col;
          dst[0] = x0;
          dst[1] = x1;
        }
      }
      if (p.num_splits > 1 && t4 == 0) {
        p.partial_lse[out_row * p.num_splits + blockIdx.y] =
            sum > 0.f ? row_max[mt][hf] + log2f(sum) : -INFINITY;
      }
    }
  }
#endif
}

// Merges the splits of every output row: one warp per (b, t, query head).
template <typename scalar_t>
__global__ void tree_attention_combine_kernel(const TreeAttentionParams<scalar_t> p) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.tokens * p.q_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t b = row / (static_cast<int64_t>(p.tokens) * p.q_heads);
  const int64_t used = used_splits(request_cache_len(p, b) + p.tokens, p.key_tile, p.num_splits);
  const float* lse = p.partial_lse + row * p.num_splits;
  float top = -INFINITY;
  for (int64_t s = 0; s < used; ++s) top = fmaxf(top, lse[s]);
  scalar_t* dst = p.out + row * p.head_dim;
  if (top == -INFINITY) {
    for (int d = lane; d < p.head_dim; d += 32) dst[d] = FloatConvert<scalar_t>::from(0.f);
    return;
  }
  float total = 0.f;
  for (int64_t s = 0; s < used; ++s) total += exp2f(lse[s] - top);
  const float inv_total = 1.f / total;
  const float* part = p.partial_out + row * p.num_splits * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.f;
    for (int64_t s = 0; s < used; ++s) acc = fmaf(exp2f(lse[s] - top), part[s * p.head_dim + d], acc);
    dst[d] = FloatConvert<scalar_t>::from(acc * inv_total);
  }
}

// ------------------------------------------------------------------------- launch plan
// What cuda/tree.cu launches, shared with the emulator (csrc/cuda/emulation).

constexpr int kCombineWarps = 8;  // output rows per CTA of the combine kernel

// The grid of one call: the main kernel's CTAs (x) and splits (y), the combine kernel's CTAs.
struct TreeAttentionGrid {
  int64_t ctas;  // B * Hkv * row blocks
  int splits;
  int64_t combine_ctas;  // used when splits > 1
};

// Sets p's row blocks, key tile and splits for a main kernel with rows_per_cta x key_tile tiles,
// sizing the grid to one wave of `wave_ctas` CTAs where the work allows.
template <typename scalar_t>
TreeAttentionGrid plan_tree_attention(TreeAttentionParams<scalar_t>& p, int rows_per_cta,
                                      int key_tile, int64_t wave_ctas) {
  const int64_t rows = static_cast<int64_t>(p.tokens) * p.group;
  p.row_blocks = static_cast<int>(ceil_div<int64_t>(rows, rows_per_cta));
  p.key_tile = key_tile;
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.kv_heads * p.row_blocks;
  p.num_splits =
      choose_tree_attention_splits(ctas, wave_ctas, ceil_div<int64_t>(p.capacity, key_tile));
  const int64_t out_rows = static_cast<int64_t>(p.batch) * p.tokens * p.q_heads;
  return {ctas, p.num_splits, ceil_div<int64_t>(out_rows, kCombineWarps)};
}

// Calls launch(kernel, rows_per_cta, key_tile, smem_bytes, tile_dim) with the main kernel for
// these parameters (`kernel`: an integral_constant holding its address; tile_dim: the
// tensor-core instantiation's head dim, 0 for the SIMT kernel). tensor_cores: whether the
// device and the views allow them (sm_80+, 16-byte aligned rows).
template <typename scalar_t, typename Launch>
void dispatch_tree_attention(const TreeAttentionParams<scalar_t>& p, bool tensor_cores,
                             Launch&& launch) {
  const int tile_dim = tensor_cores ? mma_tile_dim(p.head_dim) : 0;
  if constexpr (sizeof(scalar_t) == 2) {
    if (tile_dim != 0) {
      const int64_t rows = static_cast<int64_t>(p.tokens) * p.group;
      dispatch_mma_tile(tile_dim, mma_m_tiles(tile_dim, rows), [&](auto dim, auto m_tiles) {
        constexpr int kDim = decltype(dim)::value, kMTiles = decltype(m_tiles)::value;
        using Config = MmaTileConfig<kDim, kMTiles>;
        constexpr auto kernel = &tree_attention_mma_kernel<scalar_t, kDim, kMTiles>;
        launch(std::integral_constant<decltype(kernel), kernel>{}, Config::kRows, Config::kKeys,
               static_cast<int64_t>(Config::kSmemBytes), kDim);
      });
      return;
    }
  }
  constexpr auto kernel = &tree_attention_simt_kernel<scalar_t>;
  launch(std::integral_constant<decltype(kernel), kernel>{}, kSimtRows, kSimtKeys,
         simt_smem_floats(p.head_dim) * static_cast<int64_t>(sizeof(float)), 0);
}

#endif  // SPECDEC_DEVICE_CODE

}  // namespace specdec
