// CUDA launchers of the KV-cache ops (kernels in kernels/kv_cache.cuh, row addressing in core/kv_cache.h).
//
// No host copies: index values are not read on the host, so a call never waits for the device
// (ops.compact_kv_cache_(..., validate=True) and friends check them on the host first, when the
// caller asks). Unchecked, the kernels stay inside the tensors: counts are clamped and rows whose
// source or destination lies outside the cache are skipped.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "cuda/kernels/kv_cache.cuh"
#include "kv_cache_common.h"

namespace specdec {
namespace {

// Widest access (16, 8, 4, 2 or 1 bytes) that divides every byte offset the kernel forms.
int vector_width(at::TensorList caches, std::initializer_list<int64_t> byte_quantities) {
  for (int width : {16, 8, 4, 2}) {
    bool ok = true;
    for (int64_t q : byte_quantities) ok = ok && q % width == 0;
    for (const at::Tensor& c : caches)
      ok = ok && reinterpret_cast<uintptr_t>(c.data_ptr()) % width == 0;
    if (ok) return width;
  }
  return 1;
}

template <typename index_t, typename Rows>
void launch_compact(at::TensorList caches, const Rows& rows, int64_t batch, int64_t heads,
                    int64_t row_bytes, int width, const at::Tensor& cache_lens,
                    const at::Tensor& accept_positions, const at::Tensor& num_accepted) {
  const int64_t max_accepted = accept_positions.size(1);
  auto stream = c10::cuda::getCurrentCUDAStream();
  // No rows to move (also H = 0, which would make an empty grid): only the lengths advance.
  if (batch > 0 && heads > 0 && max_accepted > 0 && row_bytes > 0) {
    CacheTensorTable table{};
    for (size_t i = 0; i < caches.size(); ++i) table.base[i] = static_cast<char*>(caches[i].data_ptr());
    const int64_t groups = static_cast<int64_t>(caches.size()) * batch * heads;
    const index_t* positions = accept_positions.const_data_ptr<index_t>();
    const index_t* counts = num_accepted.const_data_ptr<index_t>();
    const index_t* lens = cache_lens.const_data_ptr<index_t>();
    const CompactPlan plan = plan_compact(groups, row_bytes, width, max_accepted);
    const CompactShape shape{static_cast<int>(caches.size()), static_cast<int>(batch),
                             static_cast<int>(heads), static_cast<int>(max_accepted), row_bytes,
                             plan.chunk_bytes};
    dispatch_vector_width(width, [&](auto vec_tag) {
      using vec_t = decltype(vec_tag);
      if (!plan.staged) {
        TORCH_CHECK_VALUE(plan.grid_x * kCompactThreads <= INT32_MAX, "compaction of ",
                          caches.size(), " caches of ", batch, " x ", heads, " rows of ",
                          row_bytes, " bytes exceeds the kernel's 32-bit thread index");
        compact_kv_columns_kernel<vec_t, index_t, Rows>
            <<<static_cast<unsigned>(plan.grid_x), kCompactThreads, 0, stream>>>(
                table, rows, shape, positions, counts, lens);
      } else {
        // Wide accept_positions: each block stages a byte range of its rows in shared memory.
        TORCH_CHECK_VALUE(max_accepted * width <= kStagingBytes, "accept_positions.size(1) = ",
                          max_accepted, " is too large: at most ", kStagingBytes / width,
                          " accepted rows per request for this row width");
        TORCH_CHECK_VALUE(plan.grid_x <= INT32_MAX && plan.grid_y <= 65535, "compaction of ",
                          caches.size(), " caches of ", batch, " x ", heads, " rows of ",
                          row_bytes, " bytes with accept_positions.size(1) = ", max_accepted,
                          " exceeds the CUDA grid limits");
        compact_kv_rows_kernel<vec_t, index_t, Rows>
            <<<dim3(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y)),
               kCompactThreads, static_cast<size_t>(plan.smem_bytes), stream>>>(
                table, rows, shape, positions, counts, lens);
      }
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (batch > 0) {
    // After the compaction on the same stream, so no block still reads cache_lens.
    advance_cache_lens_kernel<index_t>
        <<<ceil_div<int64_t>(batch, kAdvanceLensThreads), kAdvanceLensThreads, 0, stream>>>(
        cache_lens.mutable_data_ptr<index_t>(), num_accepted.const_data_ptr<index_t>(),
        static_cast<int>(batch));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

void compact_kv_cache_cuda(at::TensorList caches, const at::Tensor& cache_lens,
                           const at::Tensor& accept_positions, const at::Tensor& num_accepted) {
  const ContiguousGeometry g =
      check_compact_args(caches, cache_lens, accept_positions, num_accepted);
  const c10::cuda::CUDAGuard guard(caches[0].device());
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "compact_kv_cache_cuda", [&] {
    const int width = vector_width(
        caches, {g.row_bytes, g.rows.stride_b, g.rows.stride_h, g.rows.stride_s});
    launch_compact<index_t>(caches, g.rows, g.batch, g.heads, g.row_bytes, width, cache_lens,
                            accept_positions, num_accepted);
  });
}

void compact_paged_kv_cache_cuda(at::TensorList caches, const at::Tensor& block_tables,
                                 const at::Tensor& cache_lens, const at::Tensor& accept_positions,
                                 const at::Tensor& num_accepted) {
  const PagedGeometry g =
      check_paged_compact_args(caches, block_tables, cache_lens, accept_positions, num_accepted);
  const int64_t batch = block_tables.size(0);
  const c10::cuda::CUDAGuard guard(caches[0].device());
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "compact_paged_kv_cache_cuda", [&] {
    const PagedRows<index_t> rows =
        paged_rows(g, block_tables.const_data_ptr<index_t>(), block_tables.size(1));
    const int width = vector_width(
        caches, {g.row_bytes, g.stride_block, g.stride_slot, g.stride_h});
    launch_compact<index_t>(caches, rows, batch, g.heads, g.row_bytes, width, cache_lens,
                            accept_positions, num_accepted);
  });
}

void rollback_paged_kv_cache_cuda(const at::Tensor& block_tables, const at::Tensor& cache_lens,
                                  const at::Tensor& new_lens, int64_t block_size,
                                  const at::Tensor& freed_blocks) {
  check_rollback_args(block_tables, cache_lens, new_lens, block_size, freed_blocks);
  const int64_t batch = block_tables.size(0);
  if (batch == 0) return;
  const c10::cuda::CUDAGuard guard(block_tables.device());
  AT_DISPATCH_INDEX_TYPES(block_tables.scalar_type(), "rollback_paged_kv_cache_cuda", [&] {
    rollback_paged_kernel<index_t><<<ceil_div<int64_t>(batch, kRollbackWarps), kRollbackWarps * 32,
                                     0, c10::cuda::getCurrentCUDAStream()>>>(
            block_tables.mutable_data_ptr<index_t>(), cache_lens.mutable_data_ptr<index_t>(),
            new_lens.const_data_ptr<index_t>(), freed_blocks.mutable_data_ptr<index_t>(),
            static_cast<int>(batch), block_tables.size(1), block_size);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("compact_kv_cache_", &compact_kv_cache_cuda);
  m.impl("compact_paged_kv_cache_", &compact_paged_kv_cache_cuda);
  m.impl("rollback_paged_kv_cache_", &rollback_paged_kv_cache_cuda);
}

}  // namespace specdec
