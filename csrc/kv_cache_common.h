// Checks and geometry shared by the CPU (kv_cache.cpp) and CUDA (cuda/kv_cache.cu) launchers
// of the KV-cache ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "checks.h"
#include "core/kv_cache.h"

namespace specdec {

// The byte range a tensor's elements span (for non-negative strides).
inline std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {begin, begin + static_cast<uintptr_t>((last + 1) * t.element_size())};
}

// Rows are moved in parallel, so no element may be reachable twice: within a tensor
// (expanded or otherwise self-overlapping views) or across tensors (aliases, overlapping views).
// Views of one stacked buffer interleave harmlessly only when their spans do not overlap, which
// holds for [L, 2, ...] buffers split along the leading dimensions.
inline void check_caches_disjoint(const at::TensorList caches) {
  std::vector<std::pair<std::pair<uintptr_t, uintptr_t>, size_t>> spans;
  for (size_t i = 0; i < caches.size(); ++i) {
    const at::Tensor& c = caches[i];
    if (c.numel() == 0) continue;
    TORCH_CHECK_VALUE(at::has_internal_overlap(c) != at::MemOverlap::Yes, "caches[", i,
                      "] has overlapping elements (an expanded view?); strides ", c.strides());
    spans.push_back({byte_span(c), i});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    TORCH_CHECK_VALUE(spans[k].first.first >= spans[k - 1].first.second, "caches[",
                      spans[k].second, "] overlaps caches[", spans[k - 1].second,
                      "] in memory; every cache tensor must be distinct");
  }
}

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
  }
  check_caches_disjoint(caches);
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

// Value checks, run on CPU copies of the index tensors (and of the block table, for `rows`).
// `rows.valid(b, p)` says whether logical position p of request b is a row of the cache.
template <typename index_t, typename Rows>
void check_compact_values(const at::Tensor& cache_lens, const at::Tensor& accept_positions,
                          const at::Tensor& num_accepted, const Rows& rows,
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
      TORCH_CHECK_VALUE(rows.valid(b, p), "accept_positions[", b, ", ", i, "] = ", p,
                  " points past the rows written for request ", b, " (", bound_description, ")");
      TORCH_CHECK_VALUE(rows.valid(b, start + i), "destination row ", start + i, " of request ", b,
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
  return {{c.stride(0) * e, c.stride(1) * e, c.stride(2) * e, c.size(2)},
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

// The arguments of a compaction of [B, H, S, D] caches; returns their geometry.
inline ContiguousGeometry check_compact_args(at::TensorList caches, const at::Tensor& cache_lens,
                                             const at::Tensor& accept_positions,
                                             const at::Tensor& num_accepted) {
  check_cache_list(caches, 4, "[B, H, S, D]");
  const ContiguousGeometry g = contiguous_geometry(caches[0]);
  check_compact_indices(cache_lens, accept_positions, num_accepted, g.batch, caches[0].device());
  return g;
}

// The arguments of a paged compaction: caches [num_blocks, block_size, H, D], block_tables
// [B, max_blocks] and the index tensors, one int dtype on the caches' device. Returns the
// caches' geometry.
inline PagedGeometry check_paged_compact_args(at::TensorList caches, const at::Tensor& block_tables,
                                              const at::Tensor& cache_lens,
                                              const at::Tensor& accept_positions,
                                              const at::Tensor& num_accepted) {
  check_cache_list(caches, 4, "[num_blocks, block_size, H, D]");
  check_index_dtype(block_tables, "block_tables");
  TORCH_CHECK_VALUE(block_tables.dim() == 2, "block_tables must have shape [B, max_blocks], got ",
                    block_tables.sizes());
  check_compact_indices(cache_lens, accept_positions, num_accepted, block_tables.size(0),
                        caches[0].device());
  check_tensor(block_tables, "block_tables", block_tables.sizes(), cache_lens.scalar_type(),
               caches[0].device());
  return paged_geometry(caches[0]);
}

// Row addressing through a block table (on whatever device `tables` points to).
template <typename index_t>
PagedRows<index_t> paged_rows(const PagedGeometry& g, const index_t* tables, int64_t max_blocks) {
  return {tables, max_blocks, g.block_size, g.stride_block, g.stride_slot, g.stride_h,
          g.num_blocks};
}


}  // namespace specdec
