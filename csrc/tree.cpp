// CPU kernels of the tree ops: the mask builder and tree attention.
//
// Tree attention mirrors the CUDA kernels' tile logic: key tiles are converted to float once and
// shared by every query row of a task (a block of tree tokens times the query heads of one KV
// head), with a per-tile online softmax in fp32.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "tree_common.h"

namespace specdec {
namespace {

// ------------------------------------------------------------------------- build_tree_masks

template <typename index_t>
void build_tree_masks_cpu_kernel(const at::Tensor& parents, const at::Tensor& prefix_lens,
                                 TreeMaskOutputs& out) {
  const int64_t batch = parents.size(0);
  const int64_t nodes = parents.size(1);
  const int64_t words = tree_mask_words(nodes);
  const index_t* par = parents.const_data_ptr<index_t>();
  const index_t* lens = prefix_lens.const_data_ptr<index_t>();
  int32_t* packed = out.packed.mutable_data_ptr<int32_t>();
  bool* dense = out.mask.mutable_data_ptr<bool>();
  int64_t* position_ids = out.position_ids.mutable_data_ptr<int64_t>();
  int64_t* depth = out.depth.mutable_data_ptr<int64_t>();
  int64_t* paths = out.retrieve_paths.mutable_data_ptr<int64_t>();
  int64_t* num_leaves = out.num_leaves.mutable_data_ptr<int64_t>();

  at::parallel_for(0, batch * nodes, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / nodes;
      const int64_t j = i - b * nodes;
      int32_t* row = packed + i * words;
      const int64_t d = tree_node_row(par + b * nodes, j, row, words);
      depth[i] = d;
      position_ids[i] = static_cast<int64_t>(lens[b]) + (d > 0 ? d : 0);
      for (int64_t k = 0; k < nodes; ++k) dense[i * nodes + k] = tree_mask_bit(row, k);
    }
  });

  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<char> has_child(nodes);
    for (int64_t b = begin; b < end; ++b) {
      const index_t* p = par + b * nodes;
      std::fill(has_child.begin(), has_child.end(), 0);
      for (int64_t j = 0; j < nodes; ++j)
        if (p[j] >= 0) has_child[p[j]] = 1;
      int64_t leaves = 0;
      for (int64_t j = 0; j < nodes; ++j) {
        if (p[j] == kPadParent || has_child[j]) continue;
        write_tree_path(p, j, depth[b * nodes + j], paths + (b * nodes + leaves) * nodes);
        ++leaves;
      }
      num_leaves[b] = leaves;
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
build_tree_masks_cpu(const at::Tensor& parents, const at::Tensor& prefix_lens) {
  check_tree_mask_args(parents, prefix_lens);
  TreeMaskOutputs out = empty_tree_mask_outputs(parents);
  AT_DISPATCH_INDEX_TYPES(parents.scalar_type(), "build_tree_masks_cpu", [&] {
    check_tree_mask_values<index_t>(parents, prefix_lens);
    build_tree_masks_cpu_kernel<index_t>(parents, prefix_lens, out);
  });
  return {out.mask, out.packed, out.position_ids, out.depth, out.retrieve_paths, out.num_leaves};
}

// ------------------------------------------------------------------------- tree_attention

constexpr int64_t kTokensPerTask = 16;
constexpr int64_t kKeyTile = 64;

// Per-task fp32 scratch: scaled queries, output accumulators, one K/V tile, scores, row stats.
struct AttentionScratch {
  std::vector<float> q, acc, k, v, scores, row_max, row_sum;
  AttentionScratch(int64_t rows, int64_t head_dim)
      : q(rows * head_dim), acc(rows * head_dim), k(kKeyTile * head_dim),
        v(kKeyTile * head_dim), scores(rows * kKeyTile), row_max(rows), row_sum(rows) {}
};

template <typename scalar_t, typename index_t>
void tree_attention_cpu_kernel(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& cache_lens,
                               const at::Tensor& tree_mask, float scale, at::Tensor& out,
                               const TreeAttentionShape& s) {
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t head_dim = s.head_dim;
  const int64_t token_blocks = ceil_div(s.tokens, kTokensPerTask);
  const scalar_t* q_ptr = q.const_data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.const_data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.const_data_ptr<scalar_t>();
  const index_t* lens = cache_lens.const_data_ptr<index_t>();
  const int32_t* mask = tree_mask.const_data_ptr<int32_t>();
  scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
  const auto qs = q.strides();
  const auto ks = k_cache.strides();
  const auto vs = v_cache.strides();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  at::parallel_for(0, s.batch * s.kv_heads * token_blocks, 1, [&](int64_t begin, int64_t end) {
    AttentionScratch w(kTokensPerTask * group, head_dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tb = task % token_blocks;
      const int64_t h = (task / token_blocks) % s.kv_heads;
      const int64_t b = task / (token_blocks * s.kv_heads);
      const int64_t t0 = tb * kTokensPerTask;
      const int64_t rows = std::min(kTokensPerTask, s.tokens - t0) * group;
      const int64_t cache_len = lens[b];
      const int64_t num_keys = cache_len + s.tokens;

      // Row r is tree token t0 + r / group, query head h * group + r % group.
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* src = q_ptr + b * qs[0] + (t0 + r / group) * qs[1] +
                              (h * group + r % group) * qs[2];
        for (int64_t d = 0; d < head_dim; ++d)
          w.q[r * head_dim + d] = static_cast<float>(src[d]) * scale;
      }
      std::fill(w.acc.begin(), w.acc.begin() + rows * head_dim, 0.f);
      std::fill(w.row_max.begin(), w.row_max.begin() + rows, kNegInf);
      std::fill(w.row_sum.begin(), w.row_sum.begin() + rows, 0.f);

      for (int64_t k0 = 0; k0 < num_keys; k0 += kKeyTile) {
        const int64_t tile = std::min(kKeyTile, num_keys - k0);
        for (int64_t i = 0; i < tile; ++i) {
          const scalar_t* ksrc = k_ptr + b * ks[0] + h * ks[1] + (k0 + i) * ks[2];
          const scalar_t* vsrc = v_ptr + b * vs[0] + h * vs[1] + (k0 + i) * vs[2];
          for (int64_t d = 0; d < head_dim; ++d) {
            w.k[i * head_dim + d] = static_cast<float>(ksrc[d]);
            w.v[i * head_dim + d] = static_cast<float>(vsrc[d]);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t* bits = mask + (b * s.tokens + t0 + r / group) * s.words;
          const float* qr = w.q.data() + r * head_dim;
          float* sr = w.scores.data() + r * kKeyTile;
          float tile_max = kNegInf;
          for (int64_t i = 0; i < tile; ++i) {
            if (!tree_key_visible(bits, k0 + i, cache_len)) {
              sr[i] = kNegInf;
              continue;
            }
            const float* kr = w.k.data() + i * head_dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < head_dim; ++d) dot += qr[d] * kr[d];
            sr[i] = dot;
            tile_max = std::max(tile_max, dot);
          }
          if (tile_max == kNegInf) continue;  // nothing visible in this tile
          const float new_max = std::max(w.row_max[r], tile_max);
          const float rescale = std::exp(w.row_max[r] - new_max);  // 0 on the first visible tile
          float* ar = w.acc.data() + r * head_dim;
          if (rescale != 1.f) {
#pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) ar[d] *= rescale;
          }
          float tile_sum = 0.f;
          for (int64_t i = 0; i < tile; ++i) {
            if (sr[i] == kNegInf) continue;
            const float p = std::exp(sr[i] - new_max);
            tile_sum += p;
            const float* vr = w.v.data() + i * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) ar[d] += p * vr[d];
          }
          w.row_sum[r] = w.row_sum[r] * rescale + tile_sum;
          w.row_max[r] = new_max;
        }
      }

      // Rows that saw no key at all (an empty mask row over an empty prefix) are zero.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = t0 + r / group;
        scalar_t* dst = out_ptr + ((b * s.tokens + t) * s.q_heads + h * group + r % group) * head_dim;
        const float inv = w.row_sum[r] > 0.f ? 1.f / w.row_sum[r] : 0.f;
        for (int64_t d = 0; d < head_dim; ++d)
          dst[d] = static_cast<scalar_t>(w.acc[r * head_dim + d] * inv);
      }
    }
  });
}

at::Tensor tree_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const at::Tensor& cache_lens,
                              const at::Tensor& tree_mask, double scale) {
  const TreeAttentionShape s = check_tree_attention_args(q, k_cache, v_cache, cache_lens, tree_mask);
  at::Tensor out = at::empty({s.batch, s.tokens, s.q_heads, s.head_dim}, q.options());
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "tree_attention_cpu", [&] {
    check_cache_lens_values<index_t>(cache_lens, s);
    using lens_t = index_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(),
                                    "tree_attention_cpu", [&] {
      tree_attention_cpu_kernel<scalar_t, lens_t>(q, k_cache, v_cache, cache_lens, tree_mask,
                                                  static_cast<float>(scale), out, s);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("build_tree_masks", &build_tree_masks_cpu);
  m.impl("tree_attention", &tree_attention_cpu);
}

}  // namespace specdec
