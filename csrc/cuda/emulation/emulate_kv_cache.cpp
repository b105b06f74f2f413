// The KV-cache kernels (cuda/kernels/kv_cache.cuh) on the emulator, launched as
// cuda/kv_cache.cu launches them: the same kernel choice and grid (plan_compact), vector type
// (dispatch_vector_width) and block sizes.

#include <exception>

#include "cuda/kernels/kv_cache.cuh"

namespace specdec {
namespace {

template <typename index_t, typename Rows>
void run_compact(char** bases, int num_tensors, const Rows& rows, int batch, int heads,
                 int64_t row_bytes, int width, index_t* lens, const index_t* positions,
                 const index_t* counts, int max_accepted, int* info) {
  if (batch > 0 && heads > 0 && max_accepted > 0 && row_bytes > 0) {
    CacheTensorTable table{};
    for (int i = 0; i < num_tensors; ++i) table.base[i] = bases[i];
    const int64_t groups = static_cast<int64_t>(num_tensors) * batch * heads;
    const CompactPlan plan = plan_compact(groups, row_bytes, width, max_accepted);
    const CompactShape shape{num_tensors, batch, heads, max_accepted, row_bytes, plan.chunk_bytes};
    if (plan.staged && max_accepted * width > kStagingBytes) {
      emu::fail("accept_positions.size(1) too large for the staged kernel");
      return;
    }
    info[0] = plan.staged ? 2 : 1;
    dispatch_vector_width(width, [&](auto vec_tag) {
      using vec_t = decltype(vec_tag);
      if (!plan.staged) {
        emu::launch({static_cast<unsigned>(plan.grid_x), 1, 1}, {kCompactThreads, 1, 1}, 0, 1, [&] {
          compact_kv_columns_kernel<vec_t, index_t, Rows>(table, rows, shape, positions, counts,
                                                          lens);
        });
      } else {
        emu::launch({static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y), 1},
                    {kCompactThreads, 1, 1}, static_cast<size_t>(plan.smem_bytes), 1, [&] {
                      compact_kv_rows_kernel<vec_t, index_t, Rows>(table, rows, shape, positions,
                                                                   counts, lens);
                    });
      }
    });
  }
  if (batch > 0) {
    emu::launch({static_cast<unsigned>(ceil_div(batch, kAdvanceLensThreads)), 1, 1},
                {kAdvanceLensThreads, 1, 1}, 0, 1,
                [&] { advance_cache_lens_kernel<index_t>(lens, counts, batch); });
  }
}

template <typename index_t>
void compact(char** bases, int num_tensors, int batch, int heads, long row_bytes, int width,
             const long* geometry, const void* block_tables, void* cache_lens,
             const void* accept_positions, const void* num_accepted, int max_accepted,
             int* info) {
  auto* lens = static_cast<index_t*>(cache_lens);
  const auto* positions = static_cast<const index_t*>(accept_positions);
  const auto* counts = static_cast<const index_t*>(num_accepted);
  if (block_tables == nullptr) {
    const ContiguousRows rows{geometry[0], geometry[1], geometry[2], geometry[3]};
    run_compact<index_t>(bases, num_tensors, rows, batch, heads, row_bytes, width, lens, positions,
                         counts, max_accepted, info);
  } else {
    const PagedRows<index_t> rows{static_cast<const index_t*>(block_tables), geometry[5],
                                  geometry[4], geometry[0], geometry[1], geometry[2],
                                  geometry[3]};
    run_compact<index_t>(bases, num_tensors, rows, batch, heads, row_bytes, width, lens, positions,
                         counts, max_accepted, info);
  }
}

template <typename index_t>
void rollback(void* block_tables, void* cache_lens, const void* new_lens, void* freed_blocks,
              int batch, long max_blocks, long block_size) {
  if (batch == 0) return;
  emu::launch({static_cast<unsigned>(ceil_div(batch, kRollbackWarps)), 1, 1},
              {kRollbackWarps * 32, 1, 1}, 0, 1, [&] {
                rollback_paged_kernel<index_t>(
                    static_cast<index_t*>(block_tables), static_cast<index_t*>(cache_lens),
                    static_cast<const index_t*>(new_lens), static_cast<index_t*>(freed_blocks),
                    batch, max_blocks, block_size);
              });
}

}  // namespace
}  // namespace specdec

extern "C" {

// Compaction of num_tensors caches, contiguous ([B, H, S, D]: geometry = stride_b, stride_h,
// stride_s, capacity, in bytes / rows) or paged (block_tables non-null: geometry = stride_block,
// stride_slot, stride_h, num_blocks, block_size, max_blocks). Index tensors int64 (index64) or
// int32. info (out): [1 register kernel, 2 shared-memory kernel].
int specdec_emu_compact(char** bases, int num_tensors, int batch, int heads, long row_bytes,
                        int width, const long* geometry, const void* block_tables,
                        void* cache_lens, const void* accept_positions, const void* num_accepted,
                        int max_accepted, int index64, int* info) {
  using namespace specdec;
  try {
    if (index64) {
      compact<int64_t>(bases, num_tensors, batch, heads, row_bytes, width, geometry, block_tables,
                       cache_lens, accept_positions, num_accepted, max_accepted, info);
    } else {
      compact<int32_t>(bases, num_tensors, batch, heads, row_bytes, width, geometry, block_tables,
                       cache_lens, accept_positions, num_accepted, max_accepted, info);
    }
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

// rollback_paged_kv_cache_: block_tables and freed_blocks [B, max_blocks], lengths [B].
int specdec_emu_rollback(void* block_tables, void* cache_lens, const void* new_lens,
                         void* freed_blocks, int batch, long max_blocks, long block_size,
                         int index64) {
  using namespace specdec;
  try {
    if (index64) {
      rollback<int64_t>(block_tables, cache_lens, new_lens, freed_blocks, batch, max_blocks,
                        block_size);
    } else {
      rollback<int32_t>(block_tables, cache_lens, new_lens, freed_blocks, batch, max_blocks,
                        block_size);
    }
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

}  // extern "C"
