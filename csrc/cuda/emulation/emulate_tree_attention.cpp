// The tree-attention kernels (cuda/kernels/tree_attention.cuh) on the emulator, launched as
// cuda/tree.cu launches them: the same kernel choice, tile shapes and grid (dispatch_tree_attention,
// plan_tree_attention), with the SM count and CTAs per SM the caller gives.

#include <cmath>
#include <exception>
#include <vector>

#include "cuda/kernels/tree_attention.cuh"

namespace specdec {
namespace {

template <typename scalar_t>
void run_tree_attention(TreeAttentionParams<scalar_t> p, bool tensor_cores, int sms,
                        int ctas_per_sm, int* info) {
  dispatch_tree_attention(p, tensor_cores, [&](auto kernel, int rows_per_cta, int key_tile,
                                               int64_t smem, int tile_dim) {
    const TreeAttentionGrid grid =
        plan_tree_attention(p, rows_per_cta, key_tile, static_cast<int64_t>(sms) * ctas_per_sm);
    std::vector<float> partial_out, partial_lse;
    if (grid.splits > 1) {  // unwritten workspace: NaN, so that a read of it shows
      const size_t rows = static_cast<size_t>(p.batch) * p.tokens * p.q_heads * grid.splits;
      partial_out.assign(rows * p.head_dim, NAN);
      partial_lse.assign(rows, NAN);
      p.partial_out = partial_out.data();
      p.partial_lse = partial_lse.data();
    }
    info[0] = tile_dim;
    info[1] = grid.splits;
    info[2] = rows_per_cta;
    info[3] = key_tile;
    emu::launch({static_cast<unsigned>(grid.ctas), static_cast<unsigned>(grid.splits), 1},
                {kTreeAttentionThreads, 1, 1}, static_cast<size_t>(smem), 1,
                [&] { decltype(kernel)::value(p); });
    if (grid.splits > 1) {
      emu::launch({static_cast<unsigned>(grid.combine_ctas), 1, 1}, {kCombineWarps * 32, 1, 1}, 0,
                  1, [&] { tree_attention_combine_kernel<scalar_t>(p); });
    }
  });
}

}  // namespace
}  // namespace specdec

extern "C" {

// dtype: 0 float32, 1 float16, 2 bfloat16. strides: q (b, t, h), k (b, h, s), v (b, h, s), in
// elements. info (out): [tile dim or 0 (SIMT), splits, rows per CTA, keys per tile].
int specdec_emu_tree_attention(int dtype, const void* q, const void* k, const void* v, void* out,
                               const void* cache_lens, int lens_int64, const int32_t* tree_mask,
                               int batch, int tokens, int q_heads, int kv_heads, int head_dim,
                               long capacity, const long* strides, double scale,
                               int tensor_cores, int sms, int ctas_per_sm, int* info) {
  using namespace specdec;
  try {
    auto run = [&](auto* typed_q) {
      using scalar_t = std::remove_const_t<std::remove_pointer_t<decltype(typed_q)>>;
      TreeAttentionParams<scalar_t> p{};
      p.q = static_cast<const scalar_t*>(q);
      p.k = static_cast<const scalar_t*>(k);
      p.v = static_cast<const scalar_t*>(v);
      p.out = static_cast<scalar_t*>(out);
      p.cache_lens = cache_lens;
      p.lens_are_int64 = lens_int64;
      p.tree_mask = tree_mask;
      p.q_stride_b = strides[0];
      p.q_stride_t = strides[1];
      p.q_stride_h = strides[2];
      p.k_stride_b = strides[3];
      p.k_stride_h = strides[4];
      p.k_stride_s = strides[5];
      p.v_stride_b = strides[6];
      p.v_stride_h = strides[7];
      p.v_stride_s = strides[8];
      p.capacity = capacity;
      p.batch = batch;
      p.tokens = tokens;
      p.q_heads = q_heads;
      p.kv_heads = kv_heads;
      p.group = q_heads / kv_heads;
      p.head_dim = head_dim;
      p.words = static_cast<int>(tree_mask_words(tokens));
      p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // log2(e), as the launcher
      run_tree_attention(p, tensor_cores != 0, sms, ctas_per_sm, info);
    };
    if (dtype == 0) {
      run(static_cast<const float*>(nullptr));
    } else if (dtype == 1) {
      run(static_cast<const __half*>(nullptr));
    } else {
      run(static_cast<const __nv_bfloat16*>(nullptr));
    }
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

}  // extern "C"
