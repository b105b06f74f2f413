// Checks and shapes shared by the CPU (tree.cpp) and CUDA (cuda/tree.cu) launchers of the
// tree ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

#include "checks.h"
#include "core/tree.h"

namespace specdec {

// ------------------------------------------------------------------------- build_tree_masks

inline void check_tree_mask_args(const at::Tensor& parents, const at::Tensor& prefix_lens) {
  check_index_dtype(parents, "parents");
  TORCH_CHECK_VALUE(parents.dim() == 2, "parents must have shape [B, T], got ", parents.sizes());
  check_tensor(parents, "parents", parents.sizes(), parents.scalar_type(), parents.device());
  check_tensor(prefix_lens, "prefix_lens", {parents.size(0)}, parents.scalar_type(),
               parents.device());
}

// Value checks on CPU copies: node 0 is the root (-1) or the request is empty (all -2); every
// other node is padding or has a real parent with a smaller index.
template <typename index_t>
void check_tree_mask_values(const at::Tensor& parents, const at::Tensor& prefix_lens) {
  const int64_t batch = parents.size(0);
  const int64_t nodes = parents.size(1);
  const index_t* par = parents.const_data_ptr<index_t>();
  const index_t* lens = prefix_lens.const_data_ptr<index_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK_VALUE(lens[b] >= 0, "prefix_lens[", b, "] = ", lens[b], " is negative");
    // Positions are prefix_lens[b] + depth: they must not wrap around.
    TORCH_CHECK_VALUE(static_cast<int64_t>(lens[b]) <= std::numeric_limits<int64_t>::max() - nodes,
                      "prefix_lens[", b, "] = ", lens[b], " leaves no room for the positions of ",
                      nodes, " tree nodes");
    if (nodes == 0) continue;
    const index_t* row = par + b * nodes;
    const int64_t root = row[0];
    TORCH_CHECK_VALUE(root == kRootParent || root == kPadParent, "parents[", b, ", 0] = ", root,
                      " must be -1 (node 0 is the root) or -2 (request without a tree)");
    for (int64_t j = 1; j < nodes; ++j) {
      const int64_t p = row[j];
      if (p == kPadParent) continue;
      TORCH_CHECK_VALUE(root != kPadParent, "parents[", b, ", 0] = -2 marks request ", b,
                        " as empty, but node ", j, " has parent ", p);
      TORCH_CHECK_VALUE(p != kRootParent, "parents[", b, ", ", j,
                        "] = -1: a tree has exactly one root, node 0");
      TORCH_CHECK_VALUE(p >= 0 && p < j, "parents[", b, ", ", j, "] = ", p,
                        " must be -2 (padding) or a node index in [0, ", j,
                        "): a parent comes before its child, so there are no cycles");
      TORCH_CHECK_VALUE(row[p] != kPadParent, "parents[", b, ", ", j, "] = ", p,
                        " names a padding node (parents[", b, ", ", p, "] = -2)");
    }
  }
}

struct TreeMaskOutputs {
  at::Tensor mask, packed, position_ids, depth, retrieve_paths, num_leaves;
};

inline TreeMaskOutputs empty_tree_mask_outputs(const at::Tensor& parents) {
  const int64_t batch = parents.size(0);
  const int64_t nodes = parents.size(1);
  const auto opts = parents.options();
  return {at::empty({batch, nodes, nodes}, opts.dtype(at::kBool)),
          at::empty({batch, nodes, tree_mask_words(nodes)}, opts.dtype(at::kInt)),
          at::empty({batch, nodes}, opts.dtype(at::kLong)),
          at::empty({batch, nodes}, opts.dtype(at::kLong)),
          at::full({batch, nodes, nodes}, -1, opts.dtype(at::kLong)),
          at::empty({batch}, opts.dtype(at::kLong))};
}

// ------------------------------------------------------------------------- build_lookahead_masks

inline void check_lookahead_args(const at::Tensor& window, const at::Tensor& levels,
                                 int64_t tree_nodes, int64_t num_rows) {
  check_index_dtype(window, "window");
  TORCH_CHECK_VALUE(window.dim() == 1, "window must have shape [B], got ", window.sizes());
  check_tensor(window, "window", window.sizes(), window.scalar_type(), window.device());
  check_tensor(levels, "levels", window.sizes(), window.scalar_type(), window.device());
  TORCH_CHECK_VALUE(tree_nodes >= 0, "tree_nodes must be >= 0, got ", tree_nodes);
  TORCH_CHECK_VALUE(num_rows >= 0, "num_rows must be >= 0, got ", num_rows);
}

// Value checks on CPU copies: non-negative sizes, every window fits in num_rows rows, and a
// request with window rows has a root to attend to.
template <typename index_t>
void check_lookahead_values(const at::Tensor& window, const at::Tensor& levels,
                            int64_t tree_nodes, int64_t num_rows) {
  const index_t* w = window.const_data_ptr<index_t>();
  const index_t* l = levels.const_data_ptr<index_t>();
  for (int64_t b = 0; b < window.size(0); ++b) {
    TORCH_CHECK_VALUE(w[b] >= 0, "window[", b, "] = ", w[b], " is negative");
    TORCH_CHECK_VALUE(l[b] >= 0, "levels[", b, "] = ", l[b], " is negative");
    const int64_t rows = lookahead_rows(w[b], l[b], num_rows);
    TORCH_CHECK_VALUE(rows <= num_rows, "request ", b, ": a window of ", w[b], " columns and ",
                      l[b], " levels has window * levels - 1 rows, more than num_rows = ",
                      num_rows);
    TORCH_CHECK_VALUE(rows == 0 || tree_nodes >= 1, "request ", b,
                      " has window rows but tree_nodes = 0: the rows attend to the root, "
                      "block column 0");
  }
}

struct LookaheadOutputs {
  at::Tensor mask, packed, positions;
};

inline LookaheadOutputs empty_lookahead_outputs(const at::Tensor& window, int64_t tree_nodes,
                                                int64_t num_rows) {
  const int64_t batch = window.size(0);
  const int64_t columns = tree_nodes + num_rows;
  const auto opts = window.options();
  return {at::empty({batch, num_rows, columns}, opts.dtype(at::kBool)),
          at::empty({batch, num_rows, tree_mask_words(columns)}, opts.dtype(at::kInt)),
          at::empty({batch, num_rows}, opts.dtype(at::kLong))};
}

// ------------------------------------------------------------------------- tree_attention

// Geometry of one tree_attention call. Strides are in elements.
struct TreeAttentionShape {
  int64_t batch, tokens, q_heads, kv_heads, head_dim, capacity, words;
};

inline bool is_attention_dtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline TreeAttentionShape check_tree_attention_args(const at::Tensor& q, const at::Tensor& k_cache,
                                                    const at::Tensor& v_cache,
                                                    const at::Tensor& cache_lens,
                                                    const at::Tensor& tree_mask,
                                                    bool narrow_cache_allowed) {
  TORCH_CHECK_VALUE(q.dim() == 4, "q must have shape [B, T, Hq, D], got ", q.sizes());
  TORCH_CHECK_VALUE(k_cache.dim() == 4, "k_cache must have shape [B, Hkv, S, D], got ",
                    k_cache.sizes());
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(), "v_cache has shape ", v_cache.sizes(),
                    " but k_cache has shape ", k_cache.sizes());
  const TreeAttentionShape s{q.size(0),       q.size(1),       q.size(2),
                             k_cache.size(1), q.size(3),       k_cache.size(2),
                             tree_mask_words(q.size(1))};
  TORCH_CHECK_VALUE(k_cache.size(0) == s.batch, "k_cache has batch ", k_cache.size(0),
                    " but q has batch ", s.batch, " (q ", q.sizes(), ", k_cache ",
                    k_cache.sizes(), ")");
  TORCH_CHECK_VALUE(k_cache.size(3) == s.head_dim, "k_cache has head dim ", k_cache.size(3),
                    " but q has head dim ", s.head_dim);
  TORCH_CHECK_VALUE(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0,
                    "the number of query heads (", s.q_heads,
                    ") must be a multiple of the number of KV heads (", s.kv_heads, ")");
  TORCH_CHECK_VALUE(s.head_dim > 0, "head dim must be positive, got q ", q.sizes());
  TORCH_CHECK_VALUE(is_attention_dtype(q.scalar_type()),
                    "q must be float32, float16 or bfloat16, got ", q.scalar_type());
  // A float32 query over a bfloat16/float16 cache (CPU): the cache widens exactly to float32.
  const bool narrow_cache = narrow_cache_allowed && q.scalar_type() == at::kFloat &&
                            k_cache.scalar_type() != at::kFloat &&
                            is_attention_dtype(k_cache.scalar_type());
  TORCH_CHECK_VALUE(v_cache.scalar_type() == k_cache.scalar_type() &&
                        (k_cache.scalar_type() == q.scalar_type() || narrow_cache),
                    "q, k_cache and v_cache must share a dtype",
                    narrow_cache_allowed ? " (or, with float32 q, k_cache and v_cache may both "
                                           "be bfloat16 or float16)"
                                         : " (on this device)",
                    ", got ", q.scalar_type(), ", ", k_cache.scalar_type(), ", ",
                    v_cache.scalar_type());
  TORCH_CHECK_VALUE(k_cache.device() == q.device() && v_cache.device() == q.device(),
                    "q, k_cache and v_cache must be on one device, got ", q.device(), ", ",
                    k_cache.device(), ", ", v_cache.device());
  TORCH_CHECK_VALUE(q.stride(3) == 1 || s.head_dim == 1,
                    "q must be contiguous in its last (head) dimension, got strides ", q.strides());
  TORCH_CHECK_VALUE(k_cache.stride(3) == 1 || s.head_dim == 1,
                    "k_cache must be contiguous in its last dimension, got strides ",
                    k_cache.strides());
  TORCH_CHECK_VALUE(v_cache.stride(3) == 1 || s.head_dim == 1,
                    "v_cache must be contiguous in its last dimension, got strides ",
                    v_cache.strides());
  check_index_dtype(cache_lens, "cache_lens");
  check_tensor(cache_lens, "cache_lens", {s.batch}, cache_lens.scalar_type(), q.device());
  TORCH_CHECK_VALUE(tree_mask.scalar_type() == at::kInt,
                    "tree_mask must be the bit-packed int32 mask [B, T, ceil(T / 32)], got dtype ",
                    tree_mask.scalar_type());
  TORCH_CHECK_VALUE(tree_mask.dim() == 3 && tree_mask.size(0) == s.batch &&
                        tree_mask.size(1) == s.tokens && tree_mask.size(2) == s.words,
                    "tree_mask must have shape [B, T, ceil(T / 32)] = [", s.batch, ", ", s.tokens,
                    ", ", s.words, "] for q of shape ", q.sizes(), ", got ", tree_mask.sizes());
  check_tensor(tree_mask, "tree_mask", tree_mask.sizes(), at::kInt, q.device());
  TORCH_CHECK_VALUE(s.capacity >= s.tokens, "the cache holds S = ", s.capacity,
                    " positions, fewer than the T = ", s.tokens, " tree tokens");
  return s;
}

// Every request's prefix plus its tree must fit in the cache: cache_lens[b] + T <= S.
template <typename index_t>
int64_t check_cache_lens_values(const at::Tensor& cache_lens, const TreeAttentionShape& s) {
  const index_t* lens = cache_lens.const_data_ptr<index_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t n = lens[b];
    TORCH_CHECK_VALUE(n >= 0, "cache_lens[", b, "] = ", n, " is negative");
    // n <= S - T, not n + T <= S: a length near the type's maximum must not wrap around.
    TORCH_CHECK_VALUE(n <= s.capacity - s.tokens, "cache_lens[", b, "] = ", n, " plus the T = ",
                      s.tokens, " tree tokens exceeds the cache length S = ", s.capacity,
                      ": the cache is too short for prefix + tree");
    longest = std::max(longest, n);
  }
  return longest;
}

}  // namespace specdec
