// CUDA launchers of the tree ops (kernels in kernels/tree_masks.cuh and
// kernels/tree_attention.cuh).
//
// build_tree_masks validates the parent arrays on the host (one small device-to-host copy),
// except while a CUDA graph is being captured. tree_attention makes no host copy at all (see
// tree_attention_cuda); its kernels clamp what they read so that bad values cannot reach outside
// the tensors.

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

#include "cuda/kernels/tree_masks.cuh"
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
    build_tree_masks_kernel<index_t><<<static_cast<unsigned>(batch), kTreeMaskThreads, 0,
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

// ------------------------------------------------------------------------- build_lookahead_masks

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_lookahead_masks_cuda(
    const at::Tensor& window, const at::Tensor& levels, int64_t tree_nodes, int64_t num_rows) {
  check_lookahead_args(window, levels, tree_nodes, num_rows);
  const c10::cuda::CUDAGuard guard(window.device());
  LookaheadOutputs out = empty_lookahead_outputs(window, tree_nodes, num_rows);
  const int64_t total = window.size(0) * num_rows;
  AT_DISPATCH_INDEX_TYPES(window.scalar_type(), "build_lookahead_masks_cuda", [&] {
    if (!capturing_graph()) {
      check_lookahead_values<index_t>(window.cpu(), levels.cpu(), tree_nodes, num_rows);
    }
    if (total == 0) return;
    const int64_t blocks = ceil_div<int64_t>(total, kLookaheadThreads);
    TORCH_CHECK_VALUE(blocks <= INT32_MAX, "build_lookahead_masks: B * num_rows = ", total,
                      " exceeds the CUDA grid limit");
    build_lookahead_masks_kernel<index_t><<<static_cast<unsigned>(blocks), kLookaheadThreads, 0,
                                            c10::cuda::getCurrentCUDAStream()>>>(
        window.const_data_ptr<index_t>(), levels.const_data_ptr<index_t>(),
        out.mask.mutable_data_ptr<bool>(), out.packed.mutable_data_ptr<int32_t>(),
        out.positions.mutable_data_ptr<int64_t>(), window.size(0), tree_nodes, num_rows);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out.mask, out.packed, out.positions};
}

// ------------------------------------------------------------------------- tree_attention

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

// Whether the tensor-core kernel may run: 2-byte dtype, sm_80 or newer, 16-byte aligned rows
// (cp.async moves 16 bytes). The head dim is checked by mma_tile_dim.
bool tensor_cores_usable(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const bool half_type = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  if (!half_type || device_info(q.get_device()).major < 8) return false;
  return aligned_rows(q, {q.stride(0), q.stride(1), q.stride(2)}) &&
         aligned_rows(k, {k.stride(0), k.stride(1), k.stride(2)}) &&
         aligned_rows(v, {v.stride(0), v.stride(1), v.stride(2)});
}

// Prepares a kernel for `smem` bytes of dynamic shared memory on `device` and returns how many
// of its CTAs fit on one SM. The attribute is raised once per kernel and size in practice (so
// graph capture normally sees no attribute calls); the kernel is a template argument so that
// each kernel keeps its own record (kernels of one dtype share a function-pointer type).
template <auto kernel>
int prepare_kernel(int64_t smem, int device) {
  static int64_t granted[kMaxDevices] = {};
  static int64_t occupancy_smem[kMaxDevices] = {};
  static int occupancy[kMaxDevices] = {};
  if (smem > granted[device]) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
    granted[device] = smem;
  }
  if (occupancy[device] == 0 || occupancy_smem[device] != smem) {
    int ctas = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &ctas, kernel, kTreeAttentionThreads, static_cast<size_t>(smem)));
    occupancy[device] = std::max(ctas, 1);
    occupancy_smem[device] = smem;
  }
  return occupancy[device];
}

// Launches the main kernel (row blocks x splits, one wave where the work allows) and, with
// several splits, the combine kernel.
template <typename scalar_t>
void launch_tree_attention(TreeAttentionParams<scalar_t> p, bool tensor_cores,
                           const at::Tensor& q) {
  const int device = q.get_device();
  dispatch_tree_attention(p, tensor_cores, [&](auto kernel, int rows_per_cta, int key_tile,
                                               int64_t smem, int) {
    constexpr auto main_kernel = decltype(kernel)::value;
    const int ctas_per_sm = prepare_kernel<main_kernel>(smem, device);
    const int64_t wave = static_cast<int64_t>(device_info(device).sms) * ctas_per_sm;
    const TreeAttentionGrid grid = plan_tree_attention(p, rows_per_cta, key_tile, wave);
    TORCH_CHECK_VALUE(grid.ctas <= INT32_MAX, "tree_attention: B * Hkv * row blocks = ", grid.ctas,
                      " exceeds the CUDA grid limit");
    at::Tensor partial_out, partial_lse;
    if (grid.splits > 1) {
      const auto opts = q.options().dtype(at::kFloat);
      partial_out = at::empty({p.batch, p.tokens, p.q_heads, p.num_splits, p.head_dim}, opts);
      partial_lse = at::empty({p.batch, p.tokens, p.q_heads, p.num_splits}, opts);
      p.partial_out = partial_out.mutable_data_ptr<float>();
      p.partial_lse = partial_lse.mutable_data_ptr<float>();
    }
    auto stream = c10::cuda::getCurrentCUDAStream();
    main_kernel<<<dim3(static_cast<unsigned>(grid.ctas), static_cast<unsigned>(grid.splits)),
                  kTreeAttentionThreads, smem, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (grid.splits > 1) {
      tree_attention_combine_kernel<scalar_t>
          <<<static_cast<unsigned>(grid.combine_ctas), kCombineWarps * 32, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

// No host copy of cache_lens: the grid depends on shapes only and each CTA sizes its key range
// from cache_lens[b] on the device, clamping values outside [0, S - T] into the cache (so
// nothing outside the tensors is read; the result for such a request is unspecified).
// ops.tree_attention(..., validate=True) checks the values on the host first.
at::Tensor tree_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& cache_lens,
                               const at::Tensor& tree_mask, double scale) {
  const TreeAttentionShape s = check_tree_attention_args(q, k_cache, v_cache, cache_lens, tree_mask,
                                                            /*narrow_cache_allowed=*/false);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({s.batch, s.tokens, s.q_heads, s.head_dim}, q.options());
  TORCH_CHECK_VALUE(s.head_dim <= kMaxCudaHeadDim, "tree_attention on CUDA supports head dims up to ",
                    kMaxCudaHeadDim, ", got ", s.head_dim);
  // No query rows (also Hq = 0, which passes the divisibility check): nothing to launch, and
  // the split heuristic would divide by a zero CTA count.
  if (s.batch == 0 || s.tokens == 0 || s.q_heads == 0) return out;
  device_info(q.get_device());  // checks the device index the per-device records use
  const bool tensor_cores = tensor_cores_usable(q, k_cache, v_cache);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "tree_attention_cuda", [&] {
    using cuda_t = typename CudaScalar<scalar_t>::type;
    TreeAttentionParams<cuda_t> p{};
    p.q = reinterpret_cast<const cuda_t*>(q.const_data_ptr<scalar_t>());
    p.k = reinterpret_cast<const cuda_t*>(k_cache.const_data_ptr<scalar_t>());
    p.v = reinterpret_cast<const cuda_t*>(v_cache.const_data_ptr<scalar_t>());
    p.out = reinterpret_cast<cuda_t*>(out.mutable_data_ptr<scalar_t>());
    p.cache_lens = cache_lens.const_data_ptr();
    p.lens_are_int64 = cache_lens.scalar_type() == at::kLong;
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
      launch_tree_attention(p, tensor_cores, q);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("build_tree_masks", &build_tree_masks_cuda);
  m.impl("build_lookahead_masks", &build_lookahead_masks_cuda);
  m.impl("tree_attention", &tree_attention_cuda);
}

}  // namespace specdec
