// Host side of the row-team launches, shared by the launchers of sample (sampling.cu),
// verify_chain (verify_chain.cu) and verify_tree (verify_tree.cu): the device's limits, the
// (cluster) launch, the dtype and vector-width dispatch, the verification workspace, and the
// raising of the errors the kernels record (kernels in kernels/sampling_kernels.cuh).
//
// Three translation units, not one: each instantiates its kernel for every dtype and vector
// width, and in one file they made the longest compile of the build (the critical path of a
// parallel build and of CI's nvcc check).
//
// Value errors are detected on the device, per request, into a small error-code tensor and
// raised as a ValueError with the same message as on the CPU: by default after the kernel (one
// small copy to the host, a synchronisation), or, under ops.deferred_errors(), when the caller
// asks (ops.raise_deferred_errors(), e.g. after the synchronisation it does to read the outputs).
// While a CUDA graph is being captured no check is possible: a request with an error has
// num_accepted = 0 and all tokens -1 (sample: token -1, probabilities 0), so nothing
// uninitialised escapes.
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda/kernels/sampling_kernels.cuh"
#include "deferred_errors.h"
#include "sampling_common.h"

namespace specdec {
// Named, not anonymous: one definition for the three launchers; apart from the emulator's
// launch helpers of the same names (emulation/team_launch.h), which live in specdec itself.
namespace row_teams {

inline bool capturing_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// The team plan's view of a device, read once per device.
inline const DeviceLimits& device_info(int device) {
  constexpr int kMaxDevices = 64;
  static DeviceLimits infos[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "device index ", device, " out of range");
  std::call_once(once[device], [device] {
    DeviceLimits& d = infos[device];
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_per_sm,
                                          cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_per_block,
                                          cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  });
  return infos[device];
}

// Launches `teams` row teams of ta.size blocks each (a cluster when size > 1).
template <typename... Params, typename... Args>
void launch_teams(void (*kernel)(Params...), int64_t teams, const TeamArgs& ta, uint32_t smem,
                  const char* what, Args&&... args) {
  const int64_t blocks = teams * ta.size;
  TORCH_CHECK_VALUE(blocks <= 0x7fffffff, what, " = ", teams, " rows need ", blocks,
                    " blocks, more than one launch can have (2^31 - 1)");
  // The default dynamic limit is 48 KiB less the kernel's static shared memory (5.5 KiB here):
  // comparing smem with 48 KiB alone launched 47 KiB plans with "invalid argument" on an H200.
  cudaFuncAttributes attributes{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (static_cast<int64_t>(smem) > attributes.maxDynamicSharedSizeBytes)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kTeamThreads);
  config.dynamicSmemBytes = smem;
  config.stream = c10::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attribute[1];
  if (ta.size > 1) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(ta.size);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// What an error message needs, owned (a deferred check runs after the call returned).
struct OwnedErrorContext {
  OpKind op;
  at::Tensor temperature, top_k, top_p, min_p, seed, offset;
  std::optional<at::Tensor> tokens, num_draft, parents, draft_probs;
  int64_t vocab = 0;

  explicit OwnedErrorContext(const ErrorContext& c)
      : op(c.op),
        temperature(c.params.temperature),
        top_k(c.params.top_k),
        top_p(c.params.top_p),
        min_p(c.params.min_p),
        seed(c.params.seed),
        offset(c.params.offset),
        vocab(c.vocab) {
    if (c.tokens != nullptr) tokens = *c.tokens;
    if (c.num_draft != nullptr) num_draft = *c.num_draft;
    if (c.parents != nullptr) parents = *c.parents;
    if (c.draft_probs != nullptr) draft_probs = *c.draft_probs;
  }

  void raise_first(const uint64_t* codes, int64_t n) const {
    const ParamTensors params{temperature, top_k, top_p, min_p, seed, offset};
    ErrorContext c{op, params};
    c.tokens = tokens ? &*tokens : nullptr;
    c.num_draft = num_draft ? &*num_draft : nullptr;
    c.parents = parents ? &*parents : nullptr;
    c.draft_probs = draft_probs ? &*draft_probs : nullptr;
    c.vocab = vocab;
    raise_first_error(codes, n, c);
  }
};

// A CUDA event marking when a deferred copy of error codes has landed.
class CopyDone {
 public:
  CopyDone() { C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CopyDone() { cudaEventDestroy(event_); }
  CopyDone(const CopyDone&) = delete;
  CopyDone& operator=(const CopyDone&) = delete;
  void record() { C10_CUDA_CHECK(cudaEventRecord(event_, c10::cuda::getCurrentCUDAStream())); }
  void wait() const { C10_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

// Raises the first request's error. By default the codes are copied to the host at once (one
// synchronisation). Under ops.deferred_errors() they are copied asynchronously into pinned
// memory and checked by ops.raise_deferred_errors(): after a synchronisation the caller does
// anyway (reading the outputs), that check costs no wait. Under CUDA-graph capture nothing is
// checked: the outputs carry the errors (num_accepted 0 and tokens -1, or token -1).
inline void raise_device_errors(const at::Tensor& errors, const ErrorContext& ctx) {
  if (capturing_graph()) return;
  if (!deferred_errors_enabled()) {
    const at::Tensor host = errors.cpu();
    raise_first_error(reinterpret_cast<const uint64_t*>(host.const_data_ptr<int64_t>()),
                      host.size(0), ctx);
    return;
  }
  at::Tensor host =
      at::empty(errors.sizes(), errors.options().device(at::kCPU).pinned_memory(true));
  host.copy_(errors, /*non_blocking=*/true);
  auto done = std::make_shared<CopyDone>();
  done->record();
  defer_error_check([host, done, owned = OwnedErrorContext(ctx)]() {
    done->wait();
    owned.raise_first(reinterpret_cast<const uint64_t*>(host.const_data_ptr<int64_t>()),
                      host.size(0));
  });
}

// Calls launch(device type tag, vector width) for the logits dtype and alignment.
template <typename Launch>
void dispatch_logits(const at::Tensor& logits, const Launch& launch) {
  const int vec = team_vector_width(logits.size(-1) * logits.element_size(), logits.data_ptr(),
                                    static_cast<int>(logits.element_size()));
  switch (logits.scalar_type()) {
    case at::kFloat: dispatch_team_width<float>(vec, launch); break;
    case at::kHalf: dispatch_team_width<__half>(vec, launch); break;
    case at::kBFloat16: dispatch_team_width<__nv_bfloat16>(vec, launch); break;
    default: TORCH_CHECK_VALUE(false, "unsupported logits dtype ", logits.scalar_type());
  }
}

// ----------------------------------------------------------------------------- verify

// Workspace of one verify call, [B, R] per field (errors and counters [B]).
struct Workspace {
  at::Tensor accepted_child, next_token, siblings, normalisers, passed, depth, errors, counters;

  Workspace(int64_t batch, int64_t rows, const at::TensorOptions& options)
      : accepted_child(at::empty({batch, rows}, options.dtype(at::kLong))),
        next_token(at::empty({batch, rows}, options.dtype(at::kLong))),
        siblings(at::empty({batch, rows}, options.dtype(at::kLong))),
        normalisers(at::empty({batch, rows}, options.dtype(at::kFloat))),
        passed(at::empty({batch, rows}, options.dtype(at::kByte))),
        depth(at::empty({batch, rows}, options.dtype(at::kInt))),
        errors(at::full({batch}, -1, options.dtype(at::kLong))),
        counters(at::zeros({batch}, options.dtype(at::kInt))) {}

  void fill(VerifyArgs& a) {
    a.accepted_child = accepted_child.mutable_data_ptr<int64_t>();
    a.next_token = next_token.mutable_data_ptr<int64_t>();
    a.siblings = siblings.mutable_data_ptr<int64_t>();
    a.normalisers = normalisers.mutable_data_ptr<float>();
    a.passed = passed.mutable_data_ptr<uint8_t>();
    a.depth = depth.mutable_data_ptr<int32_t>();
    a.errors = reinterpret_cast<unsigned long long*>(errors.mutable_data_ptr<int64_t>());
    a.counters = reinterpret_cast<unsigned int*>(counters.mutable_data_ptr<int32_t>());
  }
};

template <bool kTree>
void launch_verify(VerifyArgs& args, const at::Tensor& target_logits) {
  if (args.batch * args.rows == 0) return;
  const DeviceLimits& info = device_info(target_logits.get_device());
  dispatch_logits(target_logits, [&](auto type_tag, auto vec_tag) {
    using T = decltype(type_tag);
    constexpr int kVec = decltype(vec_tag)::value;
    uint32_t smem = 0;
    const TeamArgs ta = plan_team(args.batch * args.rows, args.vocab, sizeof(T), kVec,
                                  Elem<T>::kTable, info, smem);
    launch_teams(&verify_kernel<T, kVec, kTree>, args.batch * args.rows, ta, smem,
                 "B * (K + 1) or B * T", args, ta);
  });
}

inline VerifyArgs base_args(const at::Tensor& target_logits,
                            const std::optional<at::Tensor>& draft_probs,
                            const ParamTensors& params, const AcceptanceRule& rule) {
  VerifyArgs a{};
  a.logits = target_logits.const_data_ptr();
  a.batch = target_logits.size(0);
  a.rows = target_logits.size(1);
  a.vocab = target_logits.size(2);
  a.mantissa_bits = mantissa_bits(target_logits.scalar_type());
  a.draft_probs = draft_probs.has_value() ? draft_probs->const_data_ptr<float>() : nullptr;
  a.params = param_pointers(params);
  a.typical = rule.typical;
  a.posterior_threshold = rule.posterior_threshold;
  a.posterior_alpha = rule.posterior_alpha;
  return a;
}

}  // namespace row_teams
}  // namespace specdec
