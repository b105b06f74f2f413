// Tree masks: per-node logic shared by the CPU kernels (tree.cpp) and the CUDA kernels
// (cuda/kernels/tree_masks.cuh, cuda/kernels/tree_attention.cuh). No torch includes.
//
// A batch of trees is a parent array [B, T]: parents[b, 0] = -1 is the root, every other node's
// parent is a smaller index, -2 marks an unused (padding) node of a ragged tree. A request whose
// node 0 is -2 has no tree at all (every node padding).
//
// Masks are bit-packed rows: bit k % 32 of word k / 32 of row j says whether node k is an
// ancestor of node j or j itself.
#pragma once

#include <cstdint>

#include "core/common.h"

namespace specdec {

constexpr int64_t kPadParent = -2;
constexpr int64_t kRootParent = -1;

SPECDEC_HD int64_t tree_mask_words(int64_t num_nodes) { return ceil_div<int64_t>(num_nodes, 32); }

SPECDEC_HD bool tree_mask_bit(const int32_t* row, int64_t k) {
  return (static_cast<uint32_t>(row[k >> 5]) >> (k & 31)) & 1u;
}

SPECDEC_HD void set_tree_mask_bit(int32_t* row, int64_t k) {
  row[k >> 5] = static_cast<int32_t>(static_cast<uint32_t>(row[k >> 5]) | (1u << (k & 31)));
}

// Writes node j's packed ancestor-or-self row (`words` words) and returns its depth, -1 for a
// padding node (whose row holds only itself). The walk only follows parents with a smaller
// index, so it ends even on malformed input that was not validated (graph capture).
template <typename index_t>
SPECDEC_HD int64_t tree_node_row(const index_t* parents, int64_t j, int32_t* row, int64_t words) {
  for (int64_t w = 0; w < words; ++w) row[w] = 0;
  set_tree_mask_bit(row, j);
  if (static_cast<int64_t>(parents[j]) == kPadParent) return -1;
  int64_t depth = 0;
  for (int64_t node = j;;) {
    const int64_t p = static_cast<int64_t>(parents[node]);
    if (p < 0 || p >= node) break;
    set_tree_mask_bit(row, p);
    node = p;
    ++depth;
  }
  return depth;
}

// Writes the root-to-node path of `node` (depth + 1 entries) to path[0 .. depth].
template <typename index_t>
SPECDEC_HD void write_tree_path(const index_t* parents, int64_t node, int64_t depth,
                                int64_t* path) {
  for (int64_t d = depth; d >= 0; --d) {
    path[d] = node;
    node = static_cast<int64_t>(parents[node]);
    if (node < 0) break;
  }
}

// Whether key position `key` (< cache_len + T) is visible to the query whose packed tree-mask row
// is `row`: the prefix [0, cache_len) always, tree node key - cache_len by the mask.
SPECDEC_HD bool tree_key_visible(const int32_t* row, int64_t key, int64_t cache_len) {
  return key < cache_len || tree_mask_bit(row, key - cache_len);
}

// ------------------------------------------------------------------------- lookahead windows
//
// A lookahead window of W columns and L levels follows a verification tree of `tree_nodes`
// nodes in one block. Cell (l, i) (0 <= l < L, 0 <= i < W) is a guess for the position i + l
// after the root; cell (0, 0) is the root itself (block column 0), every other cell is window
// row r = l * W + i - 1, at block column tree_nodes + r. Row (l, i) attends to cells (0, 0..i)
// and (1..l, i): the causal sequence root, (0, 1), ..., (0, i), (1, i), ..., (l, i).

// Window rows of a request, saturated at limit + 1 (never overflows).
SPECDEC_HD int64_t lookahead_rows(int64_t window, int64_t levels, int64_t limit) {
  if (window <= 0 || levels <= 0) return 0;
  if (levels > (limit + 1) / window + 1) return limit + 1;
  const int64_t rows = window * levels - 1;
  return rows < limit + 1 ? rows : limit + 1;
}

// Writes window row r's packed mask over `words` words and returns its position offset from the
// root, -1 for a padding row (r >= rows, whose mask holds only itself). `rows` must be
// lookahead_rows(window, levels, num_rows) clamped to num_rows, so every bit set is below
// tree_nodes + num_rows.
SPECDEC_HD int64_t lookahead_row(int64_t r, int64_t window, int64_t rows, int64_t tree_nodes,
                                 int32_t* row, int64_t words) {
  for (int64_t w = 0; w < words; ++w) row[w] = 0;
  if (r >= rows) {
    set_tree_mask_bit(row, tree_nodes + r);
    return -1;
  }
  const int64_t level = (r + 1) / window;
  const int64_t column = (r + 1) - level * window;
  set_tree_mask_bit(row, 0);  // the root: cell (0, 0)
  for (int64_t j = 1; j <= column; ++j) set_tree_mask_bit(row, tree_nodes + j - 1);
  for (int64_t m = 1; m <= level; ++m) set_tree_mask_bit(row, tree_nodes + m * window + column - 1);
  return level + column;
}

}  // namespace specdec
