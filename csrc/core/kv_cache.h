// KV-cache compaction and paged rollback: row addressing shared by the CPU kernels
// (kv_cache.cpp) and the CUDA kernels (cuda/kernels/kv_cache.cuh). No torch includes.
//
// A "row" is the D contiguous elements of one (request, head, position) of one cache tensor.
// Everything here moves raw bytes, so one instantiation serves every dtype.
#pragma once

#include <cstdint>

#include "core/common.h"

namespace specdec {

// Row offsets (bytes from a cache tensor's base) for caches laid out [B, H, S, D].
struct ContiguousRows {
  int64_t stride_b;
  int64_t stride_h;
  int64_t stride_s;
  int64_t capacity;  // S

  template <typename index_t>
  SPECDEC_HD bool valid(int64_t, index_t position) const {
    return position >= 0 && static_cast<int64_t>(position) < capacity;
  }

  template <typename index_t>
  SPECDEC_HD int64_t offset(int64_t b, int64_t h, index_t position) const {
    return b * stride_b + h * stride_h + static_cast<int64_t>(position) * stride_s;
  }
};

// Row offsets for paged caches laid out [num_blocks, block_size, H, D]: logical position p of
// request b lives in slot p % block_size of block block_tables[b, p / block_size].
template <typename index_t>
struct PagedRows {
  const index_t* block_tables;  // [B, max_blocks]
  int64_t max_blocks;
  int64_t block_size;
  int64_t stride_block;
  int64_t stride_slot;
  int64_t stride_h;
  int64_t num_blocks;

  SPECDEC_HD bool valid(int64_t b, index_t position) const {
    const int64_t p = static_cast<int64_t>(position);
    if (p < 0 || p / block_size >= max_blocks) return false;
    const int64_t block = static_cast<int64_t>(block_tables[b * max_blocks + p / block_size]);
    return block >= 0 && block < num_blocks;
  }

  SPECDEC_HD int64_t offset(int64_t b, int64_t h, index_t position) const {
    const int64_t p = static_cast<int64_t>(position);
    const int64_t block = static_cast<int64_t>(block_tables[b * max_blocks + p / block_size]);
    return block * stride_block + (p % block_size) * stride_slot + h * stride_h;
  }
};

// Every cache tensor of one call (e.g. K and V of every layer), passed by value to the kernel
// so that a single launch covers all layers without a device-side pointer table.
constexpr int kMaxCacheTensors = 256;
struct CacheTensorTable {
  char* base[kMaxCacheTensors];
};

struct CompactShape {
  int num_tensors;
  int batch;
  int num_heads;
  int max_accepted;     // columns of accept_positions
  int64_t row_bytes;    // D * element size
  int64_t chunk_bytes;  // bytes of each row one CUDA block moves (a multiple of the vector width)
};

// Accepted rows per request that compact_kv_columns_kernel keeps in registers; calls with a
// wider accept_positions use compact_kv_rows_kernel.
constexpr int kCompactRegisterRows = 16;

}  // namespace specdec
