// Decision logic of the verification ops, shared by the CPU kernels (csrc/verify.cpp) and the
// CUDA kernels (cuda/kernels/sampling_kernels.cuh). No torch includes.
//
// A chain of K drafts is verified as the path tree 0 -> 1 -> ... -> num_draft (node 0 is the
// last accepted token, node i + 1 is draft i); a tree as given. Node j's target row predicts
// j's children. Everything below is written against two abstractions:
//
//   Layout (ChainLayout / TreeLayout): the structure of one request: children in index order
//     (first_child / next_sibling), parent, token of a node, whether a node exists.
//   Row (CpuRow in csrc/sampling_cpu.h, TeamRow in cuda/kernels/team_row.cuh): one
//     processed target row, with
//       int64_t argmax() const;             float prob(int64_t x) const;        // p(x)
//       float draft_prob(int64_t c, int64_t x) const;   // draft_probs of node c at token x
//       float sum(F f) const;               // float32 of the double sum of f(x, p(x)) over x
//       int64_t draw(F f, float target) const;  // smallest x with cumsum f > target
//       int64_t draw_target(float u) const;      // a draw from p with uniform u
//       bool leader() const;                // the one thread that writes shared results
//       void publish(float* slot, float value) const;  // store visible to the whole row team
//
// Decision rules (u: the uniforms of core/philox.h, in [0, 1)):
//   greedy row: a child is accepted iff its token is the row's argmax (ties to the lowest id);
//     the path is the longest accepted root-to-node path (ties: the lowest final node index),
//     the next token is the argmax of the last node's row.
//   typical row: a child with token x is accepted iff p(x) > min(eps, alpha * exp(-H(p)));
//     longest path as for greedy; the next token is drawn from the last node's p.
//   sampling row (lossless recursive rejection sampling): children are tried in index order.
//     v is the current target distribution, first p. Child c with token x and draft
//     distribution q_c (one-hot at x when no draft_probs are given) is accepted iff
//     q_c(x) > 0 and u_accept(c) * q_c(x) < v(x) (so u = 0 accepts iff v(x) > 0, and q_c(x) = 0
//     rejects). On rejection v <- max(0, v - q_c) / W_c with W_c = sum_x max(0, v(x) - q_c(x))
//     (for one-hot q_c in closed form W_c = 1 - v(x)); if W_c <= 0 (an all-zero residual) v
//     starts again from p. The first accepted child becomes the new node; if none is accepted
//     the next token is drawn from v with u_sample(node).
//   Every draw is inverse-CDF: the smallest x whose cumulative weight (accumulated in double,
//   rounded to float) exceeds u times the total weight; if rounding leaves none, the last x
//   with positive weight.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "core/sampling.h"

namespace specdec {

// Request b of verify_chain: draft_tokens[b] and num_draft[b], seen as a path tree.
struct ChainLayout {
  const int64_t* draft_tokens;  // [K] of this request
  int64_t num_draft;

  SPECDEC_HD bool is_node(int64_t j) const { return j <= num_draft; }
  SPECDEC_HD int64_t parent(int64_t c) const { return c - 1; }
  SPECDEC_HD int64_t first_child(int64_t j) const { return j < num_draft ? j + 1 : -1; }
  SPECDEC_HD int64_t next_sibling(int64_t) const { return -1; }
  SPECDEC_HD int64_t token(int64_t c) const { return draft_tokens[c - 1]; }
  SPECDEC_HD int64_t draft_row(int64_t c) const { return c - 1; }  // row of draft_probs[b]
};

// Request b of verify_tree: tree_tokens[b] and parents[b] (validated: parents[j] < j).
// Children are found by scanning parents; `siblings` (when set) caches next_sibling for the
// children a caller will walk many times (once per token in the residual passes).
struct TreeLayout {
  const int64_t* tokens;   // [T]
  const int64_t* parents;  // [T]; -1 at the root, -2 on padding nodes
  int64_t num_nodes;       // T
  const int64_t* siblings = nullptr;  // [T]: next sibling of each cached child, -1 after the last

  SPECDEC_HD bool is_node(int64_t j) const { return parents[j] != -2; }
  SPECDEC_HD int64_t parent(int64_t c) const { return parents[c]; }
  SPECDEC_HD int64_t first_child(int64_t j) const { return child_from(j, j + 1); }
  SPECDEC_HD int64_t next_sibling(int64_t c) const {
    return siblings != nullptr ? siblings[c] : child_from(parents[c], c + 1);
  }
  SPECDEC_HD int64_t token(int64_t c) const { return tokens[c]; }
  SPECDEC_HD int64_t draft_row(int64_t c) const { return c; }

  SPECDEC_HD int64_t child_from(int64_t j, int64_t start) const {
    for (int64_t c = start; c < num_nodes; ++c)
      if (parents[c] == j) return c;
    return -1;
  }
};

// Fills siblings[c] = next_sibling(c) for every child c of node j (a single scan).
SPECDEC_HD void cache_siblings(const TreeLayout& layout, int64_t j, int64_t* siblings) {
  int64_t previous = -1;
  for (int64_t c = j + 1; c < layout.num_nodes; ++c) {
    if (layout.parents[c] != j) continue;
    if (previous >= 0) siblings[previous] = c;
    previous = c;
  }
  if (previous >= 0) siblings[previous] = -1;
}

// Structural check of node j of a tree (parents of one request); kErrNone if fine. Every
// non-padding node checking its own entry rules out cycles, second roots and padding parents.
SPECDEC_HD uint32_t check_tree_node(const int64_t* parents, int64_t j) {
  const int64_t p = parents[j];
  if (j == 0) return p == -1 ? kErrNone : kErrRoot;
  if (p == -2) return kErrNone;
  if (p == -1) return kErrSecondRoot;
  if (p < 0 || p >= j) return kErrParentOrder;
  return parents[p] == -2 ? kErrPaddedParent : kErrNone;
}

// ----------------------------------------------------------------------------- sampling rows

// The current target distribution v at token x of a node whose children `from` .. up to (not
// including) `to` (in child order; to = -1: all remaining) were rejected, given p = p(x).
template <typename Layout, typename Row>
SPECDEC_HD float residual_value(const Layout& layout, const Row& row, const float* normalisers,
                                bool has_draft_probs, int64_t from, int64_t to, int64_t x,
                                float p) {
  float v = p;
  for (int64_t c = from; c >= 0 && c != to; c = layout.next_sibling(c)) {
    const float q = has_draft_probs ? row.draft_prob(c, x) : (layout.token(c) == x ? 1.0f : 0.0f);
    const float d = sub_rn(v, q);
    v = d > 0.0f ? div_rn(d, normalisers[c]) : 0.0f;
  }
  return v;
}

// f(x, p) = v(x) for the rejected children [from, to).
template <typename Layout, typename Row>
struct ResidualWeight {
  const Layout& layout;
  const Row& row;
  const float* normalisers;
  bool has_draft_probs;
  int64_t from, to;

  SPECDEC_HD float operator()(int64_t x, float p) const {
    return residual_value(layout, row, normalisers, has_draft_probs, from, to, x, p);
  }
};

// f(x, p) = max(0, v(x) - q_c(x)) for v after the rejected children [from, c).
template <typename Layout, typename Row>
struct RejectionExcess {
  const Layout& layout;
  const Row& row;
  const float* normalisers;
  int64_t from, child;

  SPECDEC_HD float operator()(int64_t x, float p) const {
    const float v = residual_value(layout, row, normalisers, true, from, child, x, p);
    const float d = sub_rn(v, row.draft_prob(child, x));
    return d > 0.0f ? d : 0.0f;
  }
};

struct SamplingDecision {
  int64_t accepted_child;  // -1: none
  int64_t next_token;      // when no child is accepted
};

// Recursive rejection sampling at one node (see the header comment). `normalisers` is indexed
// by node and receives W_c of every rejected child c.
template <typename Layout, typename Row>
SPECDEC_HD SamplingDecision decide_sampling_node(const Layout& layout, const Row& row,
                                                 const RowParams& params, int64_t node,
                                                 bool has_draft_probs, float* normalisers) {
  int64_t from = -1;  // first rejected child still in the residual; -1: v = p
  for (int64_t c = layout.first_child(node); c >= 0; c = layout.next_sibling(c)) {
    const int64_t x = layout.token(c);
    const float p = row.prob(x);
    const float v = residual_value(layout, row, normalisers, has_draft_probs, from, c, x, p);
    const float q = has_draft_probs ? row.draft_prob(c, x) : 1.0f;
    const float u = uniforms_at(params.seed, params.offset, static_cast<uint32_t>(c),
                                kStreamVerify).accept;
    if (q > 0.0f && mul_rn(u, q) < v) return {c, -1};
    if (from < 0) from = c;
    float w;
    if (has_draft_probs) {
      w = row.sum(RejectionExcess<Layout, Row>{layout, row, normalisers, from, c});
    } else {
      w = sub_rn(1.0f, v);
    }
    row.publish(normalisers + c, w);
    if (!(w > 0.0f)) from = -1;
  }
  const float u =
      uniforms_at(params.seed, params.offset, static_cast<uint32_t>(node), kStreamVerify).sample;
  if (from >= 0) {
    const ResidualWeight<Layout, Row> residual{layout, row, normalisers, has_draft_probs, from, -1};
    const float total = row.sum(residual);
    if (total > 0.0f) return {-1, row.draw(residual, mul_rn(u, total))};
  }
  return {-1, row.draw_target(u)};
}

// ----------------------------------------------------------------------------- greedy / typical

// Marks passed[c] for every child c of `node` (greedy: token == argmax; typical: p(token) >
// threshold) and returns whether any passed.
template <typename Layout, typename Row>
SPECDEC_HD bool judge_children(const Layout& layout, const Row& row, int64_t node, bool greedy,
                               float threshold, uint8_t* passed) {
  bool any = false;
  for (int64_t c = layout.first_child(node); c >= 0; c = layout.next_sibling(c)) {
    const int64_t x = layout.token(c);
    const bool ok = greedy ? x == row.argmax() : row.prob(x) > threshold;
    if (row.leader()) passed[c] = ok ? 1 : 0;
    any = any || ok;
  }
  return any;
}

// The last node of the longest accepted path (ties: the lowest index), given passed(c) for every
// child of a reached node; depth[] (scratch, num_nodes) receives each node's depth or -1.
// passed(c) reads the flag (CUDA reads it past the L1 cache: other blocks wrote it).
template <typename Layout, typename Passed>
SPECDEC_HD int64_t deepest_accepted_node(const Layout& layout, int64_t num_nodes,
                                         const Passed& passed, int32_t* depth) {
  depth[0] = 0;
  int64_t best = 0;
  for (int64_t c = 1; c < num_nodes; ++c) {
    depth[c] = -1;
    if (!layout.is_node(c)) continue;
    const int64_t p = layout.parent(c);
    if (depth[p] >= 0 && passed(c)) depth[c] = depth[p] + 1;
    if (depth[c] > depth[best]) best = c;
  }
  return best;
}

// Writes the path root -> last (excluding the root) as nodes and tokens; returns its length.
template <typename Layout>
SPECDEC_HD int64_t write_path(const Layout& layout, int64_t last, int32_t length,
                              int64_t* out_nodes, int64_t* out_tokens) {
  int64_t node = last;
  for (int64_t i = length - 1; i >= 0; --i, node = layout.parent(node)) {
    if (out_nodes != nullptr) out_nodes[i] = node;
    out_tokens[i] = layout.token(node);
  }
  return length;
}

}  // namespace specdec
