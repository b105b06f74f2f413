// CPU kernels of the KV-cache ops. One task per (cache tensor, request, head); each task
// stages its accepted rows in a buffer before writing them back, so overlapping sources and
// destinations are safe.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "kv_cache_common.h"

namespace specdec {
namespace {

template <typename index_t, typename Rows>
void compact_rows_cpu(at::TensorList caches, const Rows& rows, int64_t batch, int64_t heads,
                      int64_t row_bytes, const at::Tensor& cache_lens,
                      const at::Tensor& accept_positions, const at::Tensor& num_accepted) {
  std::vector<char*> bases;
  for (const at::Tensor& c : caches) bases.push_back(static_cast<char*>(c.data_ptr()));
  const int64_t max_accepted = accept_positions.size(1);
  const index_t* positions = accept_positions.const_data_ptr<index_t>();
  const index_t* counts = num_accepted.const_data_ptr<index_t>();
  index_t* lens = cache_lens.mutable_data_ptr<index_t>();
  const int64_t tasks = static_cast<int64_t>(bases.size()) * batch * heads;

  at::parallel_for(0, tasks, 16, [&](int64_t begin, int64_t end) {
    std::vector<char> staging;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % heads;
      const int64_t b = (task / heads) % batch;
      char* base = bases[task / (heads * batch)];
      const int64_t n = counts[b];
      if (n <= 0) continue;
      staging.resize(n * row_bytes);
      const index_t* src = positions + b * max_accepted;
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(staging.data() + i * row_bytes, base + rows.offset(b, h, src[i]), row_bytes);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(base + rows.offset(b, h, lens[b] + static_cast<index_t>(i)),
                    staging.data() + i * row_bytes, row_bytes);
    }
  });
  for (int64_t b = 0; b < batch; ++b) lens[b] += counts[b];
}

void compact_kv_cache_cpu(at::TensorList caches, const at::Tensor& cache_lens,
                          const at::Tensor& accept_positions, const at::Tensor& num_accepted) {
  const ContiguousGeometry g =
      check_compact_args(caches, cache_lens, accept_positions, num_accepted);
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "compact_kv_cache_cpu", [&] {
    check_compact_values<index_t>(cache_lens, accept_positions, num_accepted, g.rows,
                                  "positions must be < S, the cache's capacity");
    compact_rows_cpu<index_t>(caches, g.rows, g.batch, g.heads, g.row_bytes, cache_lens,
                              accept_positions, num_accepted);
  });
}

void compact_paged_kv_cache_cpu(at::TensorList caches, const at::Tensor& block_tables,
                                const at::Tensor& cache_lens, const at::Tensor& accept_positions,
                                const at::Tensor& num_accepted) {
  const PagedGeometry g =
      check_paged_compact_args(caches, block_tables, cache_lens, accept_positions, num_accepted);
  const int64_t batch = block_tables.size(0);
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "compact_paged_kv_cache_cpu", [&] {
    const index_t* tables = block_tables.const_data_ptr<index_t>();
    const int64_t max_blocks = block_tables.size(1);
    const PagedRows<index_t> rows = paged_rows(g, tables, max_blocks);
    check_compact_values<index_t>(cache_lens, accept_positions, num_accepted, rows,
                                  "its block must be allocated in block_tables");
    compact_rows_cpu<index_t>(caches, rows, batch, g.heads, g.row_bytes, cache_lens,
                              accept_positions, num_accepted);
  });
}

void rollback_paged_kv_cache_cpu(const at::Tensor& block_tables, const at::Tensor& cache_lens,
                                 const at::Tensor& new_lens, int64_t block_size,
                                 const at::Tensor& freed_blocks) {
  check_rollback_args(block_tables, cache_lens, new_lens, block_size, freed_blocks);
  AT_DISPATCH_INDEX_TYPES(block_tables.scalar_type(), "rollback_paged_kv_cache_cpu", [&] {
    check_rollback_values<index_t>(cache_lens, new_lens);
    const int64_t max_blocks = block_tables.size(1);
    index_t* tables = block_tables.mutable_data_ptr<index_t>();
    index_t* lens = cache_lens.mutable_data_ptr<index_t>();
    index_t* freed = freed_blocks.mutable_data_ptr<index_t>();
    const index_t* targets = new_lens.const_data_ptr<index_t>();
    for (int64_t b = 0; b < block_tables.size(0); ++b) {
      const int64_t keep = ceil_div<int64_t>(targets[b], block_size);
      int64_t written = 0;
      for (int64_t j = keep; j < max_blocks; ++j) {
        index_t& entry = tables[b * max_blocks + j];
        if (entry >= 0) freed[b * max_blocks + written++] = entry;
        entry = -1;  // every truncated entry, as the reference
      }
      for (int64_t j = written; j < max_blocks; ++j) freed[b * max_blocks + j] = -1;
      lens[b] = targets[b];
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("compact_kv_cache_", &compact_kv_cache_cpu);
  m.impl("compact_paged_kv_cache_", &compact_paged_kv_cache_cpu);
  m.impl("rollback_paged_kv_cache_", &rollback_paged_kv_cache_cpu);
}

}  // namespace specdec
