// CUDA kernels of KV-cache compaction and paged rollback (launchers in cuda/kv_cache.cu); the
// row addressing they share with the CPU kernels is in core/kv_cache.h. No torch includes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/common.h"
#include "core/kv_cache.h"
#include "cuda/kernels/device_code.cuh"

namespace specdec {

#if defined(SPECDEC_DEVICE_CODE)

// One thread per (cache tensor, request, head, vector column of the row), columns fastest so a
// warp reads whole rows: the thread loads its column of every accepted row into registers,
// then stores them. Every byte's reads thus precede its writes without a barrier, so sources
// and destinations may overlap; different columns never touch the same bytes. Up to
// kCompactRegisterRows independent loads per thread are in flight at once.
// Inputs are validated on the host only when the caller asks (ops.compact_kv_cache_(...,
// validate=True)); unchecked, the kernel still stays in bounds: counts are clamped to
// max_accepted and rows whose source or destination lies outside the cache are skipped.
template <typename vec_t, typename index_t, typename Rows>
__global__ void __launch_bounds__(128)
    compact_kv_columns_kernel(CacheTensorTable tensors, Rows rows, CompactShape shape,
                              const index_t* __restrict__ accept_positions,
                              const index_t* __restrict__ num_accepted,
                              const index_t* __restrict__ cache_lens) {
  const uint32_t vecs = static_cast<uint32_t>(shape.row_bytes / sizeof(vec_t));
  const uint32_t index = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t column = index % vecs;
  uint32_t rest = index / vecs;
  const uint32_t h = rest % shape.num_heads;
  rest /= shape.num_heads;
  const uint32_t b = rest % shape.batch;
  const uint32_t t = rest / shape.batch;
  if (t >= static_cast<uint32_t>(shape.num_tensors)) return;
  const int limit = shape.max_accepted < kCompactRegisterRows ? shape.max_accepted
                                                              : kCompactRegisterRows;
  // The positions are read together with the count (not after it), so the row loads wait for
  // one round of index loads, not two.
  const index_t* row_positions = accept_positions + static_cast<int64_t>(b) * shape.max_accepted;
  index_t positions[kCompactRegisterRows];
#pragma unroll
  for (int i = 0; i < kCompactRegisterRows; ++i)
    positions[i] = i < limit ? row_positions[i] : index_t(-1);
  const int count = static_cast<int>(num_accepted[b]);
  const int n = count < limit ? count : limit;
  if (n <= 0) return;
  const index_t dst_start = cache_lens[b];
  char* base = tensors.base[t] + static_cast<int64_t>(column) * sizeof(vec_t);
  vec_t staged[kCompactRegisterRows];
#pragma unroll
  for (int i = 0; i < kCompactRegisterRows; ++i) {
    if (i < n && rows.valid(b, positions[i]))
      staged[i] = *reinterpret_cast<const vec_t*>(base + rows.offset(b, h, positions[i]));
  }
#pragma unroll
  for (int i = 0; i < kCompactRegisterRows; ++i) {
    const index_t dst = dst_start + static_cast<index_t>(i);
    if (i < n && rows.valid(b, positions[i]) && rows.valid(b, dst))
      *reinterpret_cast<vec_t*>(base + rows.offset(b, h, dst)) = staged[i];
  }
}

// For accept_positions wider than kCompactRegisterRows: rows staged in shared memory.
// grid.x = num_tensors * batch * num_heads, grid.y = row chunks; dynamic shared memory holds
// max_accepted * chunk_bytes. Each block gathers its rows into shared memory, then scatters
// them: no destination is written before every source is read, so overlap is harmless.
// Bounds as in compact_kv_columns_kernel.
template <typename vec_t, typename index_t, typename Rows>
__global__ void compact_kv_rows_kernel(CacheTensorTable tensors, Rows rows, CompactShape shape,
                                       const index_t* __restrict__ accept_positions,
                                       const index_t* __restrict__ num_accepted,
                                       const index_t* __restrict__ cache_lens) {
  SPECDEC_EXTERN_SHARED(unsigned char, staging_bytes);
  vec_t* staging = reinterpret_cast<vec_t*>(staging_bytes);

  const int64_t h = blockIdx.x % shape.num_heads;
  const int64_t b = (blockIdx.x / shape.num_heads) % shape.batch;
  const int64_t t = blockIdx.x / (static_cast<int64_t>(shape.num_heads) * shape.batch);
  const int count = static_cast<int>(num_accepted[b]);
  const int n = count < shape.max_accepted ? count : shape.max_accepted;
  if (n <= 0) return;

  const int64_t chunk_begin = static_cast<int64_t>(blockIdx.y) * shape.chunk_bytes;
  const int64_t chunk_len = shape.row_bytes - chunk_begin < shape.chunk_bytes
                                ? shape.row_bytes - chunk_begin
                                : shape.chunk_bytes;
  const int vecs_per_row = static_cast<int>(chunk_len / sizeof(vec_t));
  const int total = n * vecs_per_row;
  char* base = tensors.base[t] + chunk_begin;
  const index_t* positions = accept_positions + b * shape.max_accepted;

  const index_t dst_start = cache_lens[b];
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    const int i = k / vecs_per_row;
    const int v = k - i * vecs_per_row;
    if (rows.valid(b, positions[i]))
      staging[k] = reinterpret_cast<const vec_t*>(base + rows.offset(b, h, positions[i]))[v];
  }
  __syncthreads();
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    const int i = k / vecs_per_row;
    const int v = k - i * vecs_per_row;
    const index_t dst = dst_start + static_cast<index_t>(i);
    if (rows.valid(b, positions[i]) && rows.valid(b, dst))
      reinterpret_cast<vec_t*>(base + rows.offset(b, h, dst))[v] = staging[k];
  }
}

// Runs after compact_kv_rows_kernel on the same stream, so no block still reads cache_lens.
template <typename index_t>
__global__ void advance_cache_lens_kernel(index_t* __restrict__ cache_lens,
                                          const index_t* __restrict__ num_accepted, int batch) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < batch) cache_lens[b] += num_accepted[b];
}

// One warp per request: frees every allocated block at or after the first block the new length
// no longer needs, compacting the freed ids to the left of freed_blocks[b] with a warp ballot.
template <typename index_t>
__global__ void rollback_paged_kernel(index_t* __restrict__ block_tables,
                                      index_t* __restrict__ cache_lens,
                                      const index_t* __restrict__ new_lens,
                                      index_t* __restrict__ freed_blocks, int batch,
                                      int64_t max_blocks, int64_t block_size) {
  const int warps_per_block = blockDim.x / 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= batch) return;
  const int64_t keep = ceil_div<int64_t>(static_cast<int64_t>(new_lens[b]), block_size);
  index_t* table = block_tables + b * max_blocks;
  index_t* freed = freed_blocks + b * max_blocks;
  int64_t written = 0;
  for (int64_t base = 0; base < max_blocks; base += 32) {
    const int64_t j = base + lane;
    index_t block = j < max_blocks ? table[j] : index_t(-1);
    const bool frees = j < max_blocks && j >= keep && block >= 0;
    const unsigned mask = __ballot_sync(0xffffffffu, frees);
    const int64_t slot = written + __popc(mask & ((1u << lane) - 1u));
    if (frees) freed[slot] = block;
    if (j < max_blocks && j >= keep) table[j] = -1;  // every truncated entry, as the reference
    written += __popc(mask);
  }
  for (int64_t j = written + lane; j < max_blocks; j += 32) freed[j] = -1;
  if (lane == 0) cache_lens[b] = new_lens[b];
}

// ------------------------------------------------------------------------- launch plan
// What cuda/kv_cache.cu launches, shared with the emulator (csrc/cuda/emulation).

constexpr int kCompactThreads = 128;
constexpr int64_t kStagingBytes = 32 * 1024;  // shared memory of compact_kv_rows_kernel
constexpr int kAdvanceLensThreads = 256;
constexpr int kRollbackWarps = 4;  // requests (a warp each) per block of rollback_paged_kernel

// The launch of a compaction moving rows of row_bytes bytes `width` bytes at a time, for
// `groups` = tensors * B * H row sets: the register kernel (a thread per vector column) up to
// kCompactRegisterRows accepted rows, else the staged kernel (a CTA per row set and chunk).
struct CompactPlan {
  bool staged;            // compact_kv_rows_kernel
  int64_t grid_x, grid_y;
  int64_t chunk_bytes;    // bytes of each row one staged CTA moves
  int64_t smem_bytes;
};

inline CompactPlan plan_compact(int64_t groups, int64_t row_bytes, int width,
                                int64_t max_accepted) {
  if (max_accepted <= kCompactRegisterRows) {
    const int64_t threads = groups * (row_bytes / width);
    return {false, ceil_div<int64_t>(threads, kCompactThreads), 1, row_bytes, 0};
  }
  int64_t chunk = std::min<int64_t>(row_bytes, kStagingBytes / max_accepted);
  chunk -= chunk % width;  // 0 when max_accepted * width > kStagingBytes (the launcher refuses)
  const int64_t chunks = chunk > 0 ? ceil_div<int64_t>(row_bytes, chunk) : 0;
  return {true, groups, chunks, chunk, max_accepted * chunk};
}

// Calls launch(vec_t{}) with the unsigned type of `width` bytes (16: uint4, 8: uint2, ...).
template <typename Launch>
void dispatch_vector_width(int width, Launch&& launch) {
  switch (width) {
    case 16: launch(uint4{}); break;
    case 8: launch(uint2{}); break;
    case 4: launch(uint32_t{}); break;
    case 2: launch(uint16_t{}); break;
    default: launch(uint8_t{}); break;
  }
}

#endif  // SPECDEC_DEVICE_CODE

}  // namespace specdec
