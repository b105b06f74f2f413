// The mask-builder kernels (cuda/kernels/tree_masks.cuh) on the emulator, launched as
// cuda/tree.cu launches them (a block of kTreeMaskThreads per request; kLookaheadThreads window
// rows per block). The outputs' initialisation (retrieve_paths -1, has_child 0) is the caller's,
// as it is the launcher's.

#include <exception>

#include "cuda/kernels/tree_masks.cuh"

namespace specdec {
namespace {

template <typename index_t>
void tree_masks(const void* parents, const void* prefix_lens, long batch, long nodes, bool* mask,
                int32_t* packed, int64_t* position_ids, int64_t* depth, int64_t* retrieve_paths,
                int64_t* num_leaves, int32_t* has_child) {
  if (batch == 0) return;
  emu::launch({static_cast<unsigned>(batch), 1, 1}, {kTreeMaskThreads, 1, 1}, 0, 1, [&] {
    build_tree_masks_kernel<index_t>(static_cast<const index_t*>(parents),
                                     static_cast<const index_t*>(prefix_lens), mask, packed,
                                     position_ids, depth, retrieve_paths, num_leaves, has_child,
                                     nodes);
  });
}

template <typename index_t>
void lookahead_masks(const void* window, const void* levels, long batch, long tree_nodes,
                     long num_rows, bool* mask, int32_t* packed, int64_t* positions) {
  const int64_t total = batch * num_rows;
  if (total == 0) return;
  emu::launch({static_cast<unsigned>(ceil_div<int64_t>(total, kLookaheadThreads)), 1, 1},
              {kLookaheadThreads, 1, 1}, 0, 1, [&] {
                build_lookahead_masks_kernel<index_t>(static_cast<const index_t*>(window),
                                                      static_cast<const index_t*>(levels), mask,
                                                      packed, positions, batch, tree_nodes,
                                                      num_rows);
              });
}

}  // namespace
}  // namespace specdec

extern "C" {

// build_tree_masks of parents [B, T] (int64 or int32): outputs as the op's, has_child [B, T]
// zeroed scratch.
int specdec_emu_build_tree_masks(const void* parents, const void* prefix_lens, int index64,
                                 long batch, long nodes, bool* mask, int32_t* packed,
                                 int64_t* position_ids, int64_t* depth, int64_t* retrieve_paths,
                                 int64_t* num_leaves, int32_t* has_child) {
  using namespace specdec;
  try {
    if (index64) {
      tree_masks<int64_t>(parents, prefix_lens, batch, nodes, mask, packed, position_ids, depth,
                          retrieve_paths, num_leaves, has_child);
    } else {
      tree_masks<int32_t>(parents, prefix_lens, batch, nodes, mask, packed, position_ids, depth,
                          retrieve_paths, num_leaves, has_child);
    }
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

// build_lookahead_masks of window and levels [B] (int64 or int32).
int specdec_emu_build_lookahead_masks(const void* window, const void* levels, int index64,
                                      long batch, long tree_nodes, long num_rows, bool* mask,
                                      int32_t* packed, int64_t* positions) {
  using namespace specdec;
  try {
    if (index64) {
      lookahead_masks<int64_t>(window, levels, batch, tree_nodes, num_rows, mask, packed,
                               positions);
    } else {
      lookahead_masks<int32_t>(window, levels, batch, tree_nodes, num_rows, mask, packed,
                               positions);
    }
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

}  // extern "C"
