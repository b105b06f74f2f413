// CUDA launchers of the tree ops (kernels in kernels/tree.cuh and kernels/tree_attention.cuh).
//
// Index values are validated on the host before launching (one small device-to-host copy),
// except while a CUDA graph is being captured: then the caller is trusted and the kernels clamp
// what they read so that bad values cannot reach outside the tensors.

#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <ATen/Dispatch.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

#include "cuda/kernels/tree.cuh"
#include "cuda/kernels/tree_attention.cuh"
#include "tree_common.h"

namespace specdec {
namespace {

bool capturing_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

constexpr int kMaxDevices = 64;

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// SM count and major compute capability, queried once per device.
struct DeviceInfo {
  int sms = 0, major = 0;
};

const DeviceInfo& device_info(int device) {
  static DeviceInfo cache[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "tree_attention: device index ", device,
              " out of range");
  DeviceInfo& info = cache[device];
  if (info.sms == 0) {
    info.major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
    info.sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  }
  return info;
}

// ------------------------------------------------------------------------- build_tree_masks

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
build_tree_masks_cuda(const at::Tensor& parents, const at::Tensor& prefix_lens) {
  check_tree_mask_args(parents, prefix_lens);
  const c10::cuda::CUDAGuard guard(parents.device());
  TreeMaskOutputs out = empty_tree_mask_outputs(parents);
  const int64_t batch = parents.size(0);
  const int64_t nodes = parents.size(1);
  AT_DISPATCH_INDEX_TYPES(parents.scalar_type(), "build_tree_masks_cuda", [&] {
    if (!capturing_graph()) check_tree_mask_values<index_t>(parents.cpu(), prefix_lens.cpu());
    if (batch == 0) return;
    const at::Tensor has_child = at::zeros({batch, nodes}, parents.options().dtype(at::kInt));
    build_tree_masks_kernel<index_t><<<static_cast<unsigned>(batch), 256, 0,
                                       c10::cuda::getCurrentCUDAStream()>>>(
        parents.const_data_ptr<index_t>(), prefix_lens.const_data_ptr<index_t>(),
        out.mask.mutable_data_ptr<bool>(), out.packed.mutable_data_ptr<int32_t>(),
        out.position_ids.mutable_data_ptr<int64_t>(), out.depth.mutable_data_ptr<int64_t>(),
        out.retrieve_paths.mutable_data_ptr<int64_t>(), out.num_leaves.mutable_data_ptr<int64_t>(),
        has_child.mutable_data_ptr<int32_t>(), nodes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out.mask, out.packed, out.position_ids, out.depth, out.retrieve_paths, out.num_leaves};
}

// ------------------------------------------------------------------------- tree_attention

constexpr int kMaxSplits = 256;

template <typename T>
struct CudaScalar {
  using type = T;
};
template <>
struct CudaScalar<c10::Half> {
  using type = __half;
};
template <>
struct CudaScalar<c10::BFloat16> {
  using type = __nv_bfloat16;
};

bool aligned_rows(const at::Tensor& t, std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  return true;
}

// Whether the tensor-core kernel applies: 2-byte dtype, a supported head dim, 16-byte aligned
// rows, sm_80 or newer.
bool use_mma_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t head_dim) {
  const bool half_type = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  const bool dim_ok = head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
  if (!half_type || !dim_ok) return false;
  if (device_info(q.get_device()).major < 8) return false;
  return aligned_rows(q, {q.stride(0), q.stride(1), q.stride(2)}) &&
         aligned_rows(k, {k.stride(0), k.stride(1), k.stride(2)}) &&
         aligned_rows(v, {v.stride(0), v.stride(1), v.stride(2)});
}

// Splits of the key range: enough CTAs to occupy every SM about `ctas_per_sm` times, each split
// at least one granule of keys. `max_keys` bounds cache_lens[b] + T over the batch.
int64_t choose_split_keys(int64_t base_ctas, int64_t max_keys, int ctas_per_sm, int device) {
  const int64_t granules = ceil_div<int64_t>(max_keys, kSplitGranule);
  const int64_t sms = device_info(device).sms;
  int64_t wanted = ceil_div<int64_t>(sms * ctas_per_sm, base_ctas);
  wanted = std::clamp<int64_t>(wanted, 1, std::min<int64_t>(granules, kMaxSplits));
  return ceil_div<int64_t>(granules, wanted) * kSplitGranule;
}

// Raises a kernel's dynamic shared-memory limit when it needs more than before on this device
// (once per kernel and size in practice, so graph capture normally sees no attribute calls).
// The kernel is a template argument so that each kernel keeps its own record: the kernels of one
// dtype pair (every head dim of the MMA kernel, and the SIMT kernel) share a function-pointer
// type, and a record keyed on that type would skip the attribute for a kernel never raised.
template <auto kernel>
void set_dynamic_smem(int64_t bytes, int device) {
  static int64_t granted[kMaxDevices] = {};
  if (bytes <= granted[device]) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  granted[device] = bytes;
}

// The tensor-core kernel, instantiated per supported head dim (2-byte types only).
template <typename scalar_t, typename index_t>
void launch_tree_attention_mma(const TreeAttentionParams<scalar_t, index_t>& p, dim3 grid,
                               cudaStream_t stream, int device) {
  auto launch = [&](auto dim_tag) {
    constexpr int kDim = decltype(dim_tag)::value;
    const int64_t smem = MmaSmemLayout<kDim>::bytes;
    set_dynamic_smem<tree_attention_mma_kernel<scalar_t, index_t, kDim>>(smem, device);
    tree_attention_mma_kernel<scalar_t, index_t, kDim>
        <<<grid, kTreeAttentionThreads, smem, stream>>>(p);
  };
  switch (p.head_dim) {
    case 64: launch(std::integral_constant<int, 64>{}); break;
    case 80: launch(std::integral_constant<int, 80>{}); break;
    case 96: launch(std::integral_constant<int, 96>{}); break;
    default: launch(std::integral_constant<int, 128>{}); break;
  }
}

template <typename scalar_t, typename index_t>
void launch_tree_attention(TreeAttentionParams<scalar_t, index_t> p, bool mma, int64_t max_keys,
                           const at::Tensor& q) {
  const int rows_per_cta = mma ? kMmaRows : kSimtRows;
  p.row_blocks = static_cast<int>(ceil_div<int64_t>(static_cast<int64_t>(p.tokens) * p.group, rows_per_cta));
  const int64_t base_ctas = static_cast<int64_t>(p.batch) * p.kv_heads * p.row_blocks;
  TORCH_CHECK_VALUE(base_ctas <= INT32_MAX, "tree_attention: B * Hkv * row blocks = ", base_ctas,
                    " exceeds the CUDA grid limit");
  p.split_keys = choose_split_keys(base_ctas, max_keys, mma ? 2 : 4, q.get_device());
  p.num_splits = static_cast<int>(ceil_div<int64_t>(max_keys, p.split_keys));
  at::Tensor partial_out, partial_lse;
  if (p.num_splits > 1) {
    const auto opts = q.options().dtype(at::kFloat);
    partial_out = at::empty({p.batch, p.tokens, p.q_heads, p.num_splits, p.head_dim}, opts);
    partial_lse = at::empty({p.batch, p.tokens, p.q_heads, p.num_splits}, opts);
    p.partial_out = partial_out.mutable_data_ptr<float>();
    p.partial_lse = partial_lse.mutable_data_ptr<float>();
  }
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int device = q.get_device();
  const dim3 grid(static_cast<unsigned>(base_ctas), static_cast<unsigned>(p.num_splits));
  if constexpr (sizeof(scalar_t) == 2) {
    if (mma) launch_tree_attention_mma(p, grid, stream, device);
  }
  if (!mma) {
    const int64_t smem = simt_smem_floats(p.head_dim) * static_cast<int64_t>(sizeof(float));
    set_dynamic_smem<tree_attention_simt_kernel<scalar_t, index_t>>(smem, device);
    tree_attention_simt_kernel<scalar_t, index_t><<<grid, kTreeAttentionThreads, smem, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.num_splits > 1) {
    constexpr int kWarps = 8;
    const int64_t rows = static_cast<int64_t>(p.batch) * p.tokens * p.q_heads;
    tree_attention_combine_kernel<scalar_t, index_t>
        <<<static_cast<unsigned>(ceil_div<int64_t>(rows, kWarps)), kWarps * 32, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

at::Tensor tree_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& cache_lens,
                               const at::Tensor& tree_mask, double scale) {
  const TreeAttentionShape s = check_tree_attention_args(q, k_cache, v_cache, cache_lens, tree_mask);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({s.batch, s.tokens, s.q_heads, s.head_dim}, q.options());
  TORCH_CHECK_VALUE(s.head_dim <= kMaxCudaHeadDim, "tree_attention on CUDA supports head dims up to ",
                    kMaxCudaHeadDim, ", got ", s.head_dim);
  // No query rows (also Hq = 0, which passes the divisibility check): nothing to launch, and
  // the split heuristic would divide by a zero CTA count.
  if (s.batch == 0 || s.tokens == 0 || s.q_heads == 0) return out;
  const bool mma = use_mma_kernel(q, k_cache, v_cache, s.head_dim);
  AT_DISPATCH_INDEX_TYPES(cache_lens.scalar_type(), "tree_attention_cuda", [&] {
    // Without a host check (graph capture) every prefix may be as long as the cache allows.
    int64_t longest_prefix = s.capacity - s.tokens;
    if (!capturing_graph()) longest_prefix = check_cache_lens_values<index_t>(cache_lens.cpu(), s);
    using lens_t = index_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "tree_attention_cuda", [&] {
      using cuda_t = typename CudaScalar<scalar_t>::type;
      TreeAttentionParams<cuda_t, lens_t> p{};
      p.q = reinterpret_cast<const cuda_t*>(q.const_data_ptr<scalar_t>());
      p.k = reinterpret_cast<const cuda_t*>(k_cache.const_data_ptr<scalar_t>());
      p.v = reinterpret_cast<const cuda_t*>(v_cache.const_data_ptr<scalar_t>());
      p.out = reinterpret_cast<cuda_t*>(out.mutable_data_ptr<scalar_t>());
      p.cache_lens = cache_lens.const_data_ptr<lens_t>();
      p.tree_mask = tree_mask.const_data_ptr<int32_t>();
      p.q_stride_b = q.stride(0);
      p.q_stride_t = q.stride(1);
      p.q_stride_h = q.stride(2);
      p.k_stride_b = k_cache.stride(0);
      p.k_stride_h = k_cache.stride(1);
      p.k_stride_s = k_cache.stride(2);
      p.v_stride_b = v_cache.stride(0);
      p.v_stride_h = v_cache.stride(1);
      p.v_stride_s = v_cache.stride(2);
      p.capacity = s.capacity;
      p.batch = static_cast<int>(s.batch);
      p.tokens = static_cast<int>(s.tokens);
      p.q_heads = static_cast<int>(s.q_heads);
      p.kv_heads = static_cast<int>(s.kv_heads);
      p.group = static_cast<int>(s.q_heads / s.kv_heads);
      p.head_dim = static_cast<int>(s.head_dim);
      p.words = static_cast<int>(s.words);
      p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // log2(e)
      if constexpr (std::is_same_v<scalar_t, double>) {
        TORCH_CHECK_VALUE(false, "tree_attention does not support float64");  // rejected earlier
      } else {
        launch_tree_attention(p, mma, longest_prefix + s.tokens, q);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("build_tree_masks", &build_tree_masks_cuda);
  m.impl("tree_attention", &tree_attention_cuda);
}

}  // namespace specdec
