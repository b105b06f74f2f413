// The CUDA kernels of tree attention and KV compaction run on the CPU through the emulator
// (cuda_emulator.h), behind a C interface for python_tests/test_cuda_emulation.py. Built by that
// test with a host compiler: g++ -std=c++20 -DSPECDEC_EMULATE_CUDA -shared ...
//
// The orchestration mirrors the launchers in csrc/cuda/tree.cu and csrc/cuda/kv_cache.cu (which
// need torch and a GPU): the same kernel choice, tile shapes, split heuristic (with the SM count
// and CTAs per SM given by the caller) and launch order.

#define SPECDEC_EMULATE_CUDA 1

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "cuda/kernels/kv_cache.cuh"
#include "cuda/kernels/tree_attention.cuh"

namespace specdec {
namespace {

struct Buffer {
  const void* ptr;
  long bytes;
};

void begin_launches(std::initializer_list<Buffer> globals, int adversarial) {
  emu::State& s = emu::state();
  s.error.clear();
  emu::clear_globals();
  for (const Buffer& g : globals) emu::register_global(g.ptr, static_cast<size_t>(g.bytes));
  s.mode = adversarial ? emu::Mode::Adversarial : emu::Mode::Lockstep;
}

int finish(char* error, int error_len) {
  const std::string& message = emu::state().error;
  if (message.empty()) return 0;
  std::snprintf(error, static_cast<size_t>(error_len), "%s", message.c_str());
  return 1;
}

template <typename scalar_t>
void run_tree_attention(TreeAttentionParams<scalar_t> p, bool tensor_cores, int sms,
                        int ctas_per_sm, int* info) {
  const int64_t rows = static_cast<int64_t>(p.tokens) * p.group;
  auto run = [&](void (*kernel)(const TreeAttentionParams<scalar_t>), int rows_per_cta,
                 int key_tile, int64_t smem) {
    p.row_blocks = static_cast<int>(ceil_div<int64_t>(rows, rows_per_cta));
    p.key_tile = key_tile;
    const int64_t base = static_cast<int64_t>(p.batch) * p.kv_heads * p.row_blocks;
    p.num_splits = choose_tree_attention_splits(base, static_cast<int64_t>(sms) * ctas_per_sm,
                                                ceil_div<int64_t>(p.capacity, key_tile));
    std::vector<float> partial_out, partial_lse;
    if (p.num_splits > 1) {
      partial_out.assign(static_cast<size_t>(rows) * p.batch * p.kv_heads * p.num_splits * p.head_dim, NAN);
      partial_lse.assign(static_cast<size_t>(rows) * p.batch * p.kv_heads * p.num_splits, NAN);
      p.partial_out = partial_out.data();
      p.partial_lse = partial_lse.data();
    }
    info[1] = p.num_splits;
    info[2] = rows_per_cta;
    info[3] = key_tile;
    emu::launch({static_cast<unsigned>(base), static_cast<unsigned>(p.num_splits), 1},
                {kTreeAttentionThreads, 1, 1}, static_cast<size_t>(smem), [&] { kernel(p); });
    if (p.num_splits > 1 && emu::state().error.empty()) {
      constexpr int kWarps = 8;
      const int64_t out_rows = static_cast<int64_t>(p.batch) * p.tokens * p.q_heads;
      emu::launch({static_cast<unsigned>(ceil_div<int64_t>(out_rows, kWarps)), 1, 1},
                  {kWarps * 32, 1, 1}, 0, [&] { tree_attention_combine_kernel<scalar_t>(p); });
    }
  };
  const int tile_dim = tensor_cores ? mma_tile_dim(p.head_dim) : 0;
  if constexpr (sizeof(scalar_t) == 2) {
    if (tile_dim != 0) {
      info[0] = tile_dim;
      dispatch_mma_tile(tile_dim, mma_m_tiles(tile_dim, rows), [&](auto dim, auto m_tiles) {
        using Config = MmaTileConfig<decltype(dim)::value, decltype(m_tiles)::value>;
        run(&tree_attention_mma_kernel<scalar_t, decltype(dim)::value, decltype(m_tiles)::value>,
            Config::kRows, Config::kKeys, Config::kSmemBytes);
      });
      return;
    }
  }
  info[0] = 0;
  run(&tree_attention_simt_kernel<scalar_t>, kSimtRows, kSimtKeys,
      simt_smem_floats(p.head_dim) * static_cast<int64_t>(sizeof(float)));
}

template <typename index_t, typename Rows>
void run_compact(char** bases, int num_tensors, const Rows& rows, int batch, int heads,
                 int64_t row_bytes, int width, const index_t* lens, const index_t* positions,
                 const index_t* counts, int max_accepted, int* info) {
  CompactShape shape{num_tensors, batch, heads, max_accepted, row_bytes, row_bytes};
  CacheTensorTable table{};
  for (int i = 0; i < num_tensors; ++i) table.base[i] = bases[i];
  auto launch = [&](auto vec_tag) {
    using vec_t = decltype(vec_tag);
    if (max_accepted <= kCompactRegisterRows) {
      info[0] = 1;
      const int64_t threads = static_cast<int64_t>(num_tensors) * batch * heads *
                              (row_bytes / static_cast<int64_t>(sizeof(vec_t)));
      emu::launch({static_cast<unsigned>(ceil_div<int64_t>(threads, 128)), 1, 1}, {128, 1, 1}, 0,
                  [&] {
                    compact_kv_columns_kernel<vec_t, index_t, Rows>(table, rows, shape, positions,
                                                                    counts, lens);
                  });
    } else {
      info[0] = 2;
      constexpr int64_t kStagingBytes = 32 * 1024;  // as csrc/cuda/kv_cache.cu
      int64_t chunk = std::min<int64_t>(row_bytes, kStagingBytes / max_accepted);
      chunk -= chunk % width;
      shape.chunk_bytes = chunk;
      emu::launch({static_cast<unsigned>(num_tensors * batch * heads),
                   static_cast<unsigned>(ceil_div<int64_t>(row_bytes, chunk)), 1},
                  {128, 1, 1}, static_cast<size_t>(max_accepted * chunk), [&] {
                    compact_kv_rows_kernel<vec_t, index_t, Rows>(table, rows, shape, positions,
                                                                 counts, lens);
                  });
    }
  };
  switch (width) {
    case 16: launch(uint4{}); break;
    case 8: launch(uint2{}); break;
    case 4: launch(uint32_t{}); break;
    case 2: launch(uint16_t{}); break;
    default: launch(uint8_t{}); break;
  }
  if (emu::state().error.empty()) {
    emu::launch({static_cast<unsigned>(ceil_div(batch, 256)), 1, 1}, {256, 1, 1}, 0, [&] {
      advance_cache_lens_kernel<index_t>(const_cast<index_t*>(lens), counts, batch);
    });
  }
}

}  // namespace
}  // namespace specdec

extern "C" {

// dtype: 0 float32, 1 float16, 2 bfloat16. strides: q (b, t, h), k (b, h, s), v (b, h, s), in
// elements. spans: bytes readable from q, k, v. info (out): [tile dim or 0 (SIMT), splits, rows
// per CTA, keys per tile].
int specdec_emu_tree_attention(int dtype, const void* q, const void* k, const void* v, void* out,
                               const void* cache_lens, int lens_int64, const int32_t* tree_mask,
                               int batch, int tokens, int q_heads, int kv_heads, int head_dim,
                               long capacity, const long* strides, const long* spans,
                               double scale, int tensor_cores, int sms, int ctas_per_sm,
                               int adversarial, int* info, char* error, int error_len) {
  using namespace specdec;
  try {
    const long words = ceil_div<long>(tokens, 32);
    begin_launches({{q, spans[0]}, {k, spans[1]}, {v, spans[2]}}, adversarial);
    auto fill = [&](auto* typed_q) {
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
      p.words = static_cast<int>(words);
      p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
      run_tree_attention(p, tensor_cores != 0, sms, ctas_per_sm, info);
    };
    if (dtype == 0) {
      fill(static_cast<const float*>(nullptr));
    } else if (dtype == 1) {
      fill(static_cast<const __half*>(nullptr));
    } else {
      fill(static_cast<const __nv_bfloat16*>(nullptr));
    }
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<size_t>(error_len), "%s", e.what());
    return 1;
  }
  return finish(error, error_len);
}

// Compaction of num_tensors caches, contiguous ([B, H, S, D]: geometry = stride_b, stride_h,
// stride_s, capacity, in bytes / rows) or paged (block_tables non-null: geometry = stride_block,
// stride_slot, stride_h, num_blocks, block_size, max_blocks). Index tensors int64. spans: bytes of
// each cache from its base. info (out): [1 register kernel, 2 shared-memory kernel].
int specdec_emu_compact(char** bases, const long* spans, int num_tensors, int batch, int heads,
                        long row_bytes, int width, const long* geometry,
                        const int64_t* block_tables, int64_t* cache_lens,
                        const int64_t* accept_positions, const int64_t* num_accepted,
                        int max_accepted, int adversarial, int* info, char* error, int error_len) {
  using namespace specdec;
  try {
    begin_launches({}, adversarial);
    for (int i = 0; i < num_tensors; ++i) emu::register_global(bases[i], spans[i]);
    if (block_tables == nullptr) {
      const ContiguousRows rows{geometry[0], geometry[1], geometry[2], geometry[3]};
      run_compact<int64_t>(bases, num_tensors, rows, batch, heads, row_bytes, width, cache_lens,
                           accept_positions, num_accepted, max_accepted, info);
    } else {
      const PagedRows<int64_t> rows{block_tables, geometry[5], geometry[4], geometry[0],
                                    geometry[1],  geometry[2], geometry[3]};
      run_compact<int64_t>(bases, num_tensors, rows, batch, heads, row_bytes, width, cache_lens,
                           accept_positions, num_accepted, max_accepted, info);
    }
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<size_t>(error_len), "%s", e.what());
    return 1;
  }
  return finish(error, error_len);
}

}  // extern "C"
