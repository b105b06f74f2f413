// Checks and geometry shared by the CPU (kv_cache.cpp) and CUDA (cuda/kv_cache.cu) launchers
// of the KV-cache ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <unordered_set>
#include <vector>

#include "checks.h"
#include "cuda/kernels/kv_cache.cuh"

namespace specdec {

// Every tensor in `caches` must have the same shape, strides, dtype and device as the first,
// a contiguous last dimension and its own storage region (aliases would be moved twice).
inline void check_cache_list(const at::TensorList caches, int64_t expected_dim,
                             const char* layout) {
  TORCH_CHECK_VALUE(!caches.empty(), "caches must hold at least one tensor");
  TORCH_CHECK_VALUE(static_cast<int64_t>(caches.size()) <= kMaxCacheTensors, "caches holds ",
              caches.size(), " tensors; at most ", kMaxCacheTensors,
              " (K and V of 128 layers) are supported per call");
  const at::Tensor& first = caches[0];
  TORCH_CHECK_VALUE(first.dim() == expected_dim, "caches[0] must be ", expected_dim, "-D ", layout,
              ", got shape ", first.sizes());
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < caches.size(); ++i) {
    const at::Tensor& c = caches[i];
    TORCH_CHECK_VALUE(c.sizes() == first.sizes(), "caches[", i, "] has shape ", c.sizes(),
                " but caches[0] has shape ", first.sizes());
    TORCH_CHECK_VALUE(c.strides() == first.strides(), "caches[", i, "] has strides ", c.strides(),
                " but caches[0] has strides ", first.strides());
    TORCH_CHECK_VALUE(c.scalar_type() == first.scalar_type(), "caches[", i, "] has dtype ",
                c.scalar_type(), " but caches[0] has dtype ", first.scalar_type());
    TORCH_CHECK_VALUE(c.device() == first.device(), "caches[", i, "] is on ", c.device(),
                " but caches[0] is on ", first.device());
    TORCH_CHECK_VALUE(c.stride(-1) == 1 || c.size(-1) <= 1, "caches[", i,
                "] must be contiguous in its last (head) dimension, got strides ", c.strides());
    TORCH_CHECK_VALUE(seen.insert(c.data_ptr()).second, "caches[", i,
                "] aliases an earlier cache tensor (same data pointer)");
  }
}

// The index tensors of a compaction call: cache_lens [B], num_accepted [B],
// accept_positions [B, P], all of one int dtype on the caches' device.
inline void check_compact_indices(const at::Tensor& cache_lens,
                                  const at::Tensor& accept_positions,
                                  const at::Tensor& num_accepted, int64_t batch,
                                  c10::Device device) {
  check_index_dtype(cache_lens, "cache_lens");
  const auto dtype = cache_lens.scalar_type();
  check_tensor(cache_lens, "cache_lens", {batch}, dtype, device);
  TORCH_CHECK_VALUE(accept_positions.dim() == 2 && accept_positions.size(0) == batch,
              "accept_positions must have shape [B, P] with B = ", batch, ", got ",
              accept_positions.sizes());
  check_tensor(accept_positions, "accept_positions", accept_positions.sizes(), dtype, device);
  check_tensor(num_accepted, "num_accepted", {batch}, dtype, device);
}

// Value checks, run on CPU copies of the index tensors. `position_ok(b, p)` says whether logical
// position p of request b is a row that may be read or written.
template <typename index_t, typename PositionOk>
void check_compact_values(const at::Tensor& cache_lens, const at::Tensor& accept_positions,
                          const at::Tensor& num_accepted, PositionOk position_ok,
                          const char* bound_description) {
  const int64_t batch = cache_lens.size(0);
  const int64_t max_accepted = accept_positions.size(1);
  const index_t* lens = cache_lens.const_data_ptr<index_t>();
  const index_t* positions = accept_positions.const_data_ptr<index_t>();
  const index_t* counts = num_accepted.const_data_ptr<index_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = counts[b];
    const int64_t start = lens[b];
    TORCH_CHECK_VALUE(n >= 0 && n <= max_accepted, "num_accepted[", b, "] = ", n,
                " must be in [0, accept_positions.size(1) = ", max_accepted, "]");
    TORCH_CHECK_VALUE(start >= 0, "cache_lens[", b, "] = ", start, " is negative");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = positions[b * max_accepted + i];
      TORCH_CHECK_VALUE(p >= start, "accept_positions[", b, ", ", i, "] = ", p,
                  " lies in the committed prefix (cache_lens[", b, "] = ", start,
                  "); accepted rows must come from the speculative rows after it");
      TORCH_CHECK_VALUE(position_ok(b, p), "accept_positions[", b, ", ", i, "] = ", p,
                  " points past the rows written for request ", b, " (", bound_description, ")");
      TORCH_CHECK_VALUE(position_ok(b, start + i), "destination row ", start + i, " of request ", b,
                  " (cache_lens[", b, "] + ", i, ") lies past the cache (", bound_description,
                  ")");
    }
  }
}

// Checks for the paged rollback: block_tables [B, M], cache_lens [B], new_lens [B],
// freed_blocks [B, M], one int dtype, one device.
inline void check_rollback_args(const at::Tensor& block_tables, const at::Tensor& cache_lens,
                                const at::Tensor& new_lens, int64_t block_size,
                                const at::Tensor& freed_blocks) {
  check_index_dtype(block_tables, "block_tables");
  TORCH_CHECK_VALUE(block_tables.dim() == 2, "block_tables must have shape [B, max_blocks], got ",
              block_tables.sizes());
  TORCH_CHECK_VALUE(block_size > 0, "block_size must be positive, got ", block_size);
  const auto dtype = block_tables.scalar_type();
  const auto device = block_tables.device();
  const int64_t batch = block_tables.size(0);
  check_tensor(block_tables, "block_tables", block_tables.sizes(), dtype, device);
  check_tensor(cache_lens, "cache_lens", {batch}, dtype, device);
  check_tensor(new_lens, "new_lens", {batch}, dtype, device);
  check_tensor(freed_blocks, "freed_blocks", block_tables.sizes(), dtype, device);
}

template <typename index_t>
void check_rollback_values(const at::Tensor& cache_lens, const at::Tensor& new_lens) {
  const index_t* lens = cache_lens.const_data_ptr<index_t>();
  const index_t* targets = new_lens.const_data_ptr<index_t>();
  for (int64_t b = 0; b < cache_lens.size(0); ++b) {
    TORCH_CHECK_VALUE(targets[b] >= 0 && targets[b] <= lens[b], "new_lens[", b, "] = ", targets[b],
                " must be in [0, cache_lens[", b, "] = ", lens[b], "]: rollback only truncates");
  }
}

// Byte geometry of a list of [B, H, S, D] caches.
struct ContiguousGeometry {
  ContiguousRows rows;
  int64_t batch, heads, capacity, row_bytes;
};

inline ContiguousGeometry contiguous_geometry(const at::Tensor& c) {
  const int64_t e = c.element_size();
  return {{c.stride(0) * e, c.stride(1) * e, c.stride(2) * e},
          c.size(0), c.size(1), c.size(2), c.size(3) * e};
}

// Byte geometry of a list of [num_blocks, block_size, H, D] caches (rows without the table).
struct PagedGeometry {
  int64_t num_blocks, block_size, heads, row_bytes;
  int64_t stride_block, stride_slot, stride_h;
};

inline PagedGeometry paged_geometry(const at::Tensor& c) {
  const int64_t e = c.element_size();
  return {c.size(0), c.size(1), c.size(2), c.size(3) * e,
          c.stride(0) * e, c.stride(1) * e, c.stride(2) * e};
}

// Checks a position against a block table (CPU copy): the block must exist and be allocated.
template <typename index_t>
struct PagedPositionCheck {
  const index_t* tables;
  int64_t max_blocks, block_size, num_blocks;
  bool operator()(int64_t b, int64_t p) const {
    if (p < 0 || p / block_size >= max_blocks) return false;
    const int64_t block = tables[b * max_blocks + p / block_size];
    return block >= 0 && block < num_blocks;
  }
};

}  // namespace specdec
