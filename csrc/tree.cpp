// CPU kernels of the tree ops: the mask builder and tree attention.
//
// Tree attention mirrors the CUDA kernels' tile logic: a task is a block of tree tokens times the
// query heads of one KV head; each key tile (converted to float once) serves all its rows through
// two small GEMMs (scores = Q K^T, acc += P V), with a per-tile online softmax in fp32 between.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
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
constexpr int64_t kKeyTile = 256;

// One task's K or V tile as a float [tile, D] matrix: a strided view of the cache itself for
// float32, else a converted copy in `buffer`.
template <typename scalar_t>
at::Tensor key_tile(const scalar_t* rows, int64_t row_stride, int64_t tile, int64_t head_dim,
                    std::vector<float>& buffer) {
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  if constexpr (std::is_same_v<scalar_t, float>) {
    return at::from_blob(const_cast<float*>(rows), {tile, head_dim}, {row_stride, 1}, opts);
  } else {
    for (int64_t i = 0; i < tile; ++i)
      for (int64_t d = 0; d < head_dim; ++d)
        buffer[i * head_dim + d] = static_cast<float>(rows[i * row_stride + d]);
    return at::from_blob(buffer.data(), {tile, head_dim}, opts);
  }
}

// Online softmax over one tile of scores (in place: scores become probabilities, 0 where
// masked). Returns the factor the row's earlier accumulators must be scaled by.
float softmax_tile_row(float* scores, int64_t tile, int64_t key0, int64_t cache_len,
                       const int32_t* bits, float& row_max, float& row_sum) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float tile_max = kNegInf;
  for (int64_t i = 0; i < tile; ++i) {
    if (!tree_key_visible(bits, key0 + i, cache_len)) scores[i] = kNegInf;
    tile_max = std::max(tile_max, scores[i]);
  }
  if (tile_max == kNegInf) {  // nothing visible to this row in this tile
    std::fill(scores, scores + tile, 0.f);
    return 1.f;
  }
  const float new_max = std::max(row_max, tile_max);
  const float rescale = std::exp(row_max - new_max);  // 0 on the first visible tile
  float tile_sum = 0.f;
  for (int64_t i = 0; i < tile; ++i) {
    scores[i] = std::exp(scores[i] - new_max);  // exp(-inf) = 0 for masked keys
    tile_sum += scores[i];
  }
  row_sum = row_sum * rescale + tile_sum;
  row_max = new_max;
  return rescale;
}

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
  const auto opts = at::TensorOptions().dtype(at::kFloat);

  at::parallel_for(0, s.batch * s.kv_heads * token_blocks, 1, [&](int64_t begin, int64_t end) {
    const int64_t max_rows = kTokensPerTask * group;
    std::vector<float> q_buf(max_rows * head_dim), acc_buf(max_rows * head_dim);
    std::vector<float> k_buf(kKeyTile * head_dim), v_buf(kKeyTile * head_dim);
    std::vector<float> score_buf(max_rows * kKeyTile);
    std::vector<float> row_max(max_rows), row_sum(max_rows), rescale(max_rows);
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
        for (int64_t d = 0; d < head_dim; ++d) q_buf[r * head_dim + d] = static_cast<float>(src[d]) * scale;
      }
      const at::Tensor q_rows = at::from_blob(q_buf.data(), {rows, head_dim}, opts);
      at::Tensor acc = at::from_blob(acc_buf.data(), {rows, head_dim}, opts);
      acc.zero_();
      std::fill(row_max.begin(), row_max.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(row_sum.begin(), row_sum.begin() + rows, 0.f);

      for (int64_t k0 = 0; k0 < num_keys; k0 += kKeyTile) {
        const int64_t tile = std::min(kKeyTile, num_keys - k0);
        const at::Tensor keys = key_tile(k_ptr + b * ks[0] + h * ks[1] + k0 * ks[2], ks[2], tile, head_dim, k_buf);
        const at::Tensor values = key_tile(v_ptr + b * vs[0] + h * vs[1] + k0 * vs[2], vs[2], tile, head_dim, v_buf);
        at::Tensor scores = at::from_blob(score_buf.data(), {rows, tile}, opts);
        at::mm_out(scores, q_rows, keys.t());
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t* bits = mask + (b * s.tokens + t0 + r / group) * s.words;
          rescale[r] = softmax_tile_row(score_buf.data() + r * tile, tile, k0, cache_len, bits,
                                        row_max[r], row_sum[r]);
          if (rescale[r] != 1.f) {
            float* ar = acc_buf.data() + r * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) ar[d] *= rescale[r];
          }
        }
        acc.addmm_(scores, values);
      }

      // Rows that saw no key at all (an empty mask row over an empty prefix) are zero.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = t0 + r / group;
        scalar_t* dst = out_ptr + ((b * s.tokens + t) * s.q_heads + h * group + r % group) * head_dim;
        const float inv = row_sum[r] > 0.f ? 1.f / row_sum[r] : 0.f;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<scalar_t>(acc_buf[r * head_dim + d] * inv);
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
