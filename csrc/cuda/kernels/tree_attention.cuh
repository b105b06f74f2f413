// Tree attention CUDA kernels (flash-decoding style). No torch includes.
//
// Work split: one CTA per (request b, KV head h, block of query rows, key split). The query rows
// of a KV head are all (tree token t, query head of the group g) pairs, row = t * G + g, so one
// K/V tile in shared memory serves every tree token and every query head of the group. The keys
// of request b (its cache_lens[b] prefix rows, then its T tree rows) are cut into splits of
// split_keys keys; each CTA runs an online softmax over its split's key tiles and, when there
// are several splits, writes a normalised partial output and its log-sum-exp, which
// tree_attention_combine_kernel merges. Softmax runs in the log2 domain (scores pre-multiplied
// by scale * log2(e)) in fp32.
//
// Two main kernels share that structure:
// - tree_attention_mma_kernel: fp16/bf16 with head dim 64/80/96/128 and 16-byte aligned rows;
//   tensor cores (WMMA 16x16x16, fp32 accumulation) for Q K^T and P V, 64 query rows by 64 keys
//   per tile, one warp per 16 rows.
// - tree_attention_simt_kernel: everything else (fp32, other head dims up to 256, unaligned
//   views); 16 query rows by 32 keys per tile, a lane per key for Q K^T, a lane per dim for P V.
#pragma once

#include <cstdint>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/tree.cuh"

#if defined(__CUDACC__)
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

namespace specdec {

constexpr int kTreeAttentionThreads = 128;  // 4 warps, both main kernels
constexpr int kMaxCudaHeadDim = 256;
constexpr int kSimtRowsPerWarp = 4;
constexpr int kSimtRows = 4 * kSimtRowsPerWarp;  // query rows per CTA
constexpr int kSimtKeys = 32;                    // keys per tile: one per lane
constexpr int kMmaRows = 64;                     // 16 per warp
constexpr int kMmaKeys = 64;
constexpr int kSplitGranule = 64;  // split_keys is a multiple of this (and of both key tiles)

template <typename scalar_t, typename index_t>
struct TreeAttentionParams {
  const scalar_t* q;             // [B, T, Hq, D], strides below
  const scalar_t* k;             // [B, Hkv, S, D], strides below
  const scalar_t* v;
  scalar_t* out;                 // [B, T, Hq, D] contiguous
  const index_t* cache_lens;     // [B]
  const int32_t* tree_mask;      // [B, T, words]
  float* partial_out;            // [B, T, Hq, num_splits, D] when num_splits > 1
  float* partial_lse;            // [B, T, Hq, num_splits], log2 domain, -inf when nothing seen
  int64_t q_stride_b, q_stride_t, q_stride_h;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t capacity;              // S
  int64_t split_keys;
  int batch, tokens, q_heads, kv_heads, group, head_dim, words;
  int num_splits, row_blocks;
  float scale_log2;              // softmax scale * log2(e)
};

// Shared-memory layout of the SIMT kernel, in floats.
SPECDEC_HD int64_t simt_smem_floats(int64_t head_dim) {
  return 2 * kSimtRows * head_dim        // Q (scaled) and O accumulators
         + kSimtKeys * (head_dim + 1)    // K tile, padded against bank conflicts
         + kSimtKeys * head_dim          // V tile
         + 4 * kSimtKeys;                // P of each warp
}

constexpr int align_to_128(int bytes) { return (bytes + 127) / 128 * 128; }

// Shared-memory layout of the MMA kernel (bytes). P (16 x kMmaKeys, ld kMmaLdP) of each warp
// overlays the start of that warp's 16 rows of S once they have been read.
template <int kHeadDim>
struct MmaSmemLayout {
  static constexpr int ldq = kHeadDim + 8;    // elements of Q/K/V rows (16-byte padding)
  static constexpr int lds = kMmaKeys + 4;    // floats of an S row
  static constexpr int ldp = kMmaKeys + 8;    // elements of a P row
  static constexpr int ldo = kHeadDim + 4;    // floats of an O row
  static constexpr int q_offset = 0;
  static constexpr int k_offset = align_to_128(q_offset + kMmaRows * ldq * 2);
  static constexpr int v_offset = align_to_128(k_offset + kMmaKeys * ldq * 2);
  static constexpr int s_offset = align_to_128(v_offset + kMmaKeys * ldq * 2);
  static constexpr int o_offset = align_to_128(s_offset + kMmaRows * lds * 4);
  static constexpr int stats_offset = align_to_128(o_offset + kMmaRows * ldo * 4);
  static constexpr int bytes = stats_offset + 3 * kMmaRows * 4;  // row max, row sum, rescale
  static_assert(16 * ldp * 2 <= 16 * lds * 4, "a warp's P must fit in its rows of S");
  static_assert((16 * lds * 4) % 32 == 0, "WMMA pointers must be 32-byte aligned");
};

#if defined(__CUDACC__)

template <typename T>
struct FloatConvert;
template <>
struct FloatConvert<float> {
  static __device__ __forceinline__ float to(float x) { return x; }
  static __device__ __forceinline__ float from(float x) { return x; }
};
template <>
struct FloatConvert<__half> {
  static __device__ __forceinline__ float to(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
};
template <>
struct FloatConvert<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// What one CTA works on. Cache lengths are clamped into the cache so that an unchecked call
// (during CUDA-graph capture) can never read outside it.
struct TreeAttentionWork {
  int64_t b, h, row_block, split;
  int64_t cache_len, key_begin, key_end;
};

template <typename index_t>
__device__ __forceinline__ int64_t clamped_cache_len(const index_t* cache_lens, int64_t b,
                                                     int64_t capacity, int64_t tokens) {
  const int64_t n = static_cast<int64_t>(cache_lens[b]);
  return n < 0 ? 0 : (n > capacity - tokens ? capacity - tokens : n);
}

template <typename P>
__device__ __forceinline__ TreeAttentionWork tree_attention_work(const P& p) {
  TreeAttentionWork w;
  w.row_block = blockIdx.x % p.row_blocks;
  const int64_t bh = blockIdx.x / p.row_blocks;
  w.h = bh % p.kv_heads;
  w.b = bh / p.kv_heads;
  w.split = blockIdx.y;
  w.cache_len = clamped_cache_len(p.cache_lens, w.b, p.capacity, p.tokens);
  const int64_t num_keys = w.cache_len + p.tokens;
  w.key_begin = w.split * p.split_keys;
  w.key_end = w.key_begin + p.split_keys < num_keys ? w.key_begin + p.split_keys : num_keys;
  return w;
}

// Output row index (b, t, query head) into out / partial_out.
template <typename P>
__device__ __forceinline__ int64_t tree_output_row(const P& p, int64_t b, int64_t row, int64_t h) {
  const int64_t t = row / p.group;
  return (b * p.tokens + t) * p.q_heads + h * p.group + row % p.group;
}

// Stores one row's result: the final output when there is one split, else the normalised
// partial output (the log-sum-exp is stored separately).
template <typename scalar_t, typename P>
__device__ __forceinline__ void store_tree_row(const P& p, int64_t out_row, int64_t split, int d,
                                               float value) {
  if (p.num_splits == 1) {
    p.out[out_row * p.head_dim + d] = FloatConvert<scalar_t>::from(value);
  } else {
    p.partial_out[(out_row * p.num_splits + split) * p.head_dim + d] = value;
  }
}

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kTreeAttentionThreads)
    tree_attention_simt_kernel(const TreeAttentionParams<scalar_t, index_t> p) {
  extern __shared__ __align__(16) unsigned char simt_smem[];
  using Conv = FloatConvert<scalar_t>;
  const TreeAttentionWork w = tree_attention_work(p);
  if (w.key_begin >= w.key_end) return;  // past this request's keys; the combine skips it
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
  for (int64_t tile0 = w.key_begin; tile0 < w.key_end; tile0 += kSimtKeys) {
    const int num = static_cast<int>(w.key_end - tile0 < kSimtKeys ? w.key_end - tile0 : kSimtKeys);
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
      const int32_t* bits = p.tree_mask + (w.b * p.tokens + row / p.group) * p.words;
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
      store_tree_row<scalar_t>(p, out_row, w.split, d, s_o[r * dim + d] * inv);
    if (p.num_splits > 1 && lane == 0) {
      p.partial_lse[out_row * p.num_splits + w.split] =
          row_sum[rr] > 0.f ? row_max[rr] + log2f(row_sum[rr]) : -INFINITY;
    }
  }
}

template <typename scalar_t, typename index_t, int kHeadDim>
__global__ void __launch_bounds__(kTreeAttentionThreads)
    tree_attention_mma_kernel(const TreeAttentionParams<scalar_t, index_t> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the launcher only selects this kernel on sm_80 and newer
#else
  namespace wmma = nvcuda::wmma;
  using L = MmaSmemLayout<kHeadDim>;
  using Conv = FloatConvert<scalar_t>;
  constexpr int kVec = 8;  // elements per 16-byte load
  constexpr int kVecsPerRow = kHeadDim / kVec;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  scalar_t* s_q = reinterpret_cast<scalar_t*>(mma_smem + L::q_offset);
  scalar_t* s_k = reinterpret_cast<scalar_t*>(mma_smem + L::k_offset);
  scalar_t* s_v = reinterpret_cast<scalar_t*>(mma_smem + L::v_offset);
  float* s_s = reinterpret_cast<float*>(mma_smem + L::s_offset);
  float* s_o = reinterpret_cast<float*>(mma_smem + L::o_offset);
  float* s_max = reinterpret_cast<float*>(mma_smem + L::stats_offset);
  float* s_sum = s_max + kMmaRows;
  float* s_rescale = s_sum + kMmaRows;

  const TreeAttentionWork w = tree_attention_work(p);
  if (w.key_begin >= w.key_end) return;  // past this request's keys; the combine skips it
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t total_rows = static_cast<int64_t>(p.tokens) * p.group;
  const int64_t row0 = w.row_block * kMmaRows;

  for (int i = threadIdx.x; i < kMmaRows * kVecsPerRow; i += blockDim.x) {
    const int r = i / kVecsPerRow;
    const int c = i % kVecsPerRow;
    const int64_t row = row0 + r;
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (row < total_rows) {
      const int64_t t = row / p.group;
      const int64_t head = w.h * p.group + row % p.group;
      value = *reinterpret_cast<const uint4*>(p.q + w.b * p.q_stride_b + t * p.q_stride_t +
                                              head * p.q_stride_h + c * kVec);
    }
    *reinterpret_cast<uint4*>(s_q + r * L::ldq + c * kVec) = value;
  }
  for (int i = threadIdx.x; i < kMmaRows * kHeadDim; i += blockDim.x)
    s_o[(i / kHeadDim) * L::ldo + i % kHeadDim] = 0.f;
  if (threadIdx.x < kMmaRows) {
    s_max[threadIdx.x] = -INFINITY;
    s_sum[threadIdx.x] = 0.f;
  }
  __syncthreads();

  const scalar_t* k_base = p.k + w.b * p.k_stride_b + w.h * p.k_stride_h;
  const scalar_t* v_base = p.v + w.b * p.v_stride_b + w.h * p.v_stride_h;
  // This lane's row (two lanes per row, 32 key columns each) in the softmax step.
  const int local_row = lane >> 1;
  const int r = warp * 16 + local_row;
  const int col0 = (lane & 1) * 32;
  const int64_t row = row0 + r;
  const bool row_ok = row < total_rows;
  const int32_t* bits =
      p.tree_mask + (w.b * p.tokens + (row_ok ? row / p.group : 0)) * p.words;
  scalar_t* s_p = reinterpret_cast<scalar_t*>(s_s + warp * 16 * L::lds);  // overlays S rows

  for (int64_t tile0 = w.key_begin; tile0 < w.key_end; tile0 += kMmaKeys) {
    const int num = static_cast<int>(w.key_end - tile0 < kMmaKeys ? w.key_end - tile0 : kMmaKeys);
    for (int i = threadIdx.x; i < kMmaKeys * kVecsPerRow; i += blockDim.x) {
      const int key = i / kVecsPerRow;
      const int c = i % kVecsPerRow;
      uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
      if (key < num) {
        kv = *reinterpret_cast<const uint4*>(k_base + (tile0 + key) * p.k_stride_s + c * kVec);
        vv = *reinterpret_cast<const uint4*>(v_base + (tile0 + key) * p.v_stride_s + c * kVec);
      }
      *reinterpret_cast<uint4*>(s_k + key * L::ldq + c * kVec) = kv;
      *reinterpret_cast<uint4*>(s_v + key * L::ldq + c * kVec) = vv;
    }
    __syncthreads();

    // S = Q K^T for this warp's 16 rows and the tile's 64 keys.
#pragma unroll
    for (int n = 0; n < kMmaKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, scalar_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, scalar_t, wmma::col_major> b;
        wmma::load_matrix_sync(a, s_q + warp * 16 * L::ldq + kk * 16, L::ldq);
        wmma::load_matrix_sync(b, s_k + n * 16 * L::ldq + kk * 16, L::ldq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(s_s + warp * 16 * L::lds + n * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of the tile, in registers; then P (input dtype) over this warp's S rows.
    float scores[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = col0 + c;
      float s = -INFINITY;
      if (row_ok && col < num && tree_key_visible(bits, tile0 + col, w.cache_len))
        s = s_s[r * L::lds + col] * p.scale_log2;
      scores[c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float old_max = s_max[r];
    const float new_max = fmaxf(old_max, tile_max);
    const bool any = new_max != -INFINITY;
    const float rescale = any ? exp2f(old_max - new_max) : 1.f;
    float tile_sum = 0.f;
    __syncwarp();  // every lane has read its S values before P overwrites them
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float prob = any ? exp2f(scores[c] - new_max) : 0.f;
      tile_sum += prob;
      s_p[local_row * L::ldp + col0 + c] = Conv::from(prob);
    }
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
    if ((lane & 1) == 0) {
      s_max[r] = new_max;
      s_sum[r] = s_sum[r] * rescale + tile_sum;
      s_rescale[r] = rescale;
    }
    __syncwarp();
    for (int i = lane; i < 16 * kHeadDim; i += 32) {
      const int rr = warp * 16 + i / kHeadDim;
      s_o[rr * L::ldo + i % kHeadDim] *= s_rescale[rr];
    }
    __syncwarp();

    // O += P V for this warp's rows.
#pragma unroll
    for (int n = 0; n < kHeadDim / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, s_o + warp * 16 * L::ldo + n * 16, L::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, scalar_t, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, scalar_t, wmma::row_major> b;
        wmma::load_matrix_sync(a, s_p + kk * 16, L::ldp);
        wmma::load_matrix_sync(b, s_v + kk * 16 * L::ldq + n * 16, L::ldq);
        wmma::mma_sync(o, a, b, o);
      }
      wmma::store_matrix_sync(s_o + warp * 16 * L::ldo + n * 16, o, L::ldo, wmma::mem_row_major);
    }
    __syncthreads();  // K/V tiles and S/P are reused by the next tile
  }

  for (int i = lane; i < 16 * kHeadDim; i += 32) {
    const int rr = warp * 16 + i / kHeadDim;
    const int d = i % kHeadDim;
    const int64_t out_row_index = row0 + rr;
    if (out_row_index >= total_rows) continue;
    const float sum = s_sum[rr];
    const float value = sum > 0.f ? s_o[rr * L::ldo + d] / sum : 0.f;
    store_tree_row<scalar_t>(p, tree_output_row(p, w.b, out_row_index, w.h), w.split, d, value);
  }
  if (p.num_splits > 1 && lane < 16) {
    const int rr = warp * 16 + lane;
    if (row0 + rr < total_rows) {
      const float sum = s_sum[rr];
      p.partial_lse[tree_output_row(p, w.b, row0 + rr, w.h) * p.num_splits + w.split] =
          sum > 0.f ? s_max[rr] + log2f(sum) : -INFINITY;
    }
  }
#endif
}

// Merges the splits of every output row: one warp per (b, t, query head).
template <typename scalar_t, typename index_t>
__global__ void tree_attention_combine_kernel(const TreeAttentionParams<scalar_t, index_t> p) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.tokens * p.q_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t b = row / (static_cast<int64_t>(p.tokens) * p.q_heads);
  const int64_t num_keys = clamped_cache_len(p.cache_lens, b, p.capacity, p.tokens) + p.tokens;
  const int64_t used = ceil_div<int64_t>(num_keys, p.split_keys);  // splits that saw keys
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
  const float* part = p.partial_out + row * p.num_splits * p.head_dim;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.f;
    for (int64_t s = 0; s < used; ++s) acc = fmaf(exp2f(lse[s] - top), part[s * p.head_dim + d], acc);
    dst[d] = FloatConvert<scalar_t>::from(acc / total);
  }
}

#endif  // __CUDACC__

}  // namespace specdec
