// CUDA kernels of build_tree_masks and build_lookahead_masks (launchers in cuda/tree.cu); the
// per-node logic they share with the CPU kernels is in core/tree.h. No torch includes.
#pragma once

#include <cstdint>

#include "core/tree.h"
#include "cuda/kernels/device_code.cuh"

namespace specdec {

constexpr int kTreeMaskThreads = 256;  // threads of a build_tree_masks_kernel block (a request)
constexpr int kLookaheadThreads = 128;  // window rows per block of build_lookahead_masks_kernel

#if defined(SPECDEC_DEVICE_CODE)

// Exclusive prefix sum of `flag` over the threads of a block (blockDim.x a multiple of 32, at
// most 1024); returns it and writes the block total to *total. `scratch` holds 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int flag, int* scratch, int* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  int inclusive = flag;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  int before = 0, sum = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += scratch[w];
    sum += scratch[w];
  }
  __syncthreads();  // scratch may be reused by the caller's next scan
  *total = sum;
  return before + inclusive - flag;
}

// One block per request. has_child [B, T] is zeroed and retrieve_paths [B, T, T] filled with -1
// by the launcher.
template <typename index_t>
__global__ void build_tree_masks_kernel(const index_t* __restrict__ parents,
                                        const index_t* __restrict__ prefix_lens,
                                        bool* __restrict__ mask, int32_t* __restrict__ packed,
                                        int64_t* __restrict__ position_ids,
                                        int64_t* __restrict__ depth,
                                        int64_t* __restrict__ retrieve_paths,
                                        int64_t* __restrict__ num_leaves,
                                        int32_t* __restrict__ has_child, int64_t num_nodes) {
  SPECDEC_SHARED(int[32], scan_scratch);
  const int64_t b = blockIdx.x;
  const int64_t words = tree_mask_words(num_nodes);
  const index_t* par = parents + b * num_nodes;
  int32_t* rows = packed + b * num_nodes * words;
  int32_t* child = has_child + b * num_nodes;
  const int64_t prefix = static_cast<int64_t>(prefix_lens[b]);

  for (int64_t j = threadIdx.x; j < num_nodes; j += blockDim.x) {
    const int64_t d = tree_node_row(par, j, rows + j * words, words);
    depth[b * num_nodes + j] = d;
    position_ids[b * num_nodes + j] = prefix + (d > 0 ? d : 0);
    const int64_t p = static_cast<int64_t>(par[j]);
    if (p >= 0 && p < j) child[p] = 1;  // benign race: every writer stores 1
  }
  __syncthreads();

  bool* dense = mask + b * num_nodes * num_nodes;
  for (int64_t i = threadIdx.x; i < num_nodes * num_nodes; i += blockDim.x) {
    const int64_t j = i / num_nodes;
    dense[i] = tree_mask_bit(rows + j * words, i - j * num_nodes);
  }

  // Leaves in node order: real nodes that no real node names as parent.
  int64_t* paths = retrieve_paths + b * num_nodes * num_nodes;
  int64_t leaves_before = 0;
  for (int64_t base = 0; base < num_nodes; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const bool leaf = j < num_nodes && static_cast<int64_t>(par[j]) != kPadParent && !child[j];
    int chunk_total = 0;
    const int rank = block_exclusive_scan(leaf ? 1 : 0, scan_scratch, &chunk_total);
    if (leaf) {
      write_tree_path(par, j, depth[b * num_nodes + j], paths + (leaves_before + rank) * num_nodes);
    }
    leaves_before += chunk_total;
  }
  if (threadIdx.x == 0) num_leaves[b] = leaves_before;
}

// One thread per window row; window and levels [B], outputs as build_lookahead_masks.
template <typename index_t>
__global__ void build_lookahead_masks_kernel(const index_t* __restrict__ window,
                                             const index_t* __restrict__ levels,
                                             bool* __restrict__ mask, int32_t* __restrict__ packed,
                                             int64_t* __restrict__ positions, int64_t batch,
                                             int64_t tree_nodes, int64_t num_rows) {
  const int64_t columns = tree_nodes + num_rows;
  const int64_t words = tree_mask_words(columns);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= batch * num_rows) return;
  const int64_t b = i / num_rows;
  const int64_t r = i - b * num_rows;
  const int64_t w = static_cast<int64_t>(window[b]);
  int64_t rows = lookahead_rows(w, static_cast<int64_t>(levels[b]), num_rows);
  if (rows > num_rows) rows = num_rows;  // unchecked input (graph capture): stay in bounds
  int32_t* row = packed + i * words;
  positions[i] = lookahead_row(r, w, rows, tree_nodes, row, words);
  bool* dense = mask + i * columns;
  for (int64_t k = 0; k < columns; ++k) dense[k] = tree_mask_bit(row, k);
}

#endif  // SPECDEC_DEVICE_CODE

}  // namespace specdec
