// CUDA launchers of the sampling and verification ops (kernels in kernels/sampling_kernels.cuh).
//
// Value errors are detected on the device, per request, into a small error-code tensor; after
// the kernel it is copied to the host (one synchronisation) and the first error raised as a
// ValueError with the same message as on the CPU. While a CUDA graph is being captured no copy
// is allowed: the check is skipped, and a request with an error has num_accepted = 0 and all
// tokens -1 (sample: token -1, probabilities 0), so nothing uninitialised escapes.

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>

#include "cuda/kernels/sampling_kernels.cuh"
#include "sampling_common.h"

namespace specdec {
namespace {

bool capturing_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// 16-byte loads when every row starts 16-byte aligned, else one element at a time.
bool rows_aligned(const at::Tensor& logits) {
  const int64_t row_bytes = logits.size(-1) * logits.element_size();
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 == 0;
}

// Threads per row team: enough for the row's chunks, a multiple of 32, at most kMaxTeamThreads.
int team_threads(int64_t chunks) {
  int threads = 32;
  while (threads < kMaxTeamThreads && threads < chunks) threads *= 2;
  return threads;
}

// One block per row (sample) or per (request, node) (verify): the grid's x limit.
void check_grid(int64_t blocks, const char* what) {
  TORCH_CHECK_VALUE(blocks <= 0x7fffffff, what, " = ", blocks,
                    " exceeds the 2^31 - 1 blocks one launch can have");
}

ParamsView params_view(const ParamTensors& p) {
  return {p.temperature.const_data_ptr<float>(), p.top_k.const_data_ptr<int64_t>(),
          p.top_p.const_data_ptr<float>(),       p.min_p.const_data_ptr<float>(),
          p.seed.const_data_ptr<int64_t>(),      p.offset.const_data_ptr<int64_t>()};
}

void raise_device_errors(const at::Tensor& errors, const ErrorContext& ctx) {
  if (capturing_graph()) return;
  const at::Tensor host = errors.cpu();
  raise_first_error(reinterpret_cast<const uint64_t*>(host.const_data_ptr<int64_t>()),
                    host.size(0), ctx);
}

// Calls launch(device type tag, vector width) for the logits dtype and alignment.
template <typename T, typename Launch>
void dispatch_width(bool aligned, const Launch& launch) {
  if (aligned) {
    launch(T{}, std::integral_constant<int, 16 / static_cast<int>(sizeof(T))>{});
  } else {
    launch(T{}, std::integral_constant<int, 1>{});
  }
}

template <typename Launch>
void dispatch_logits(const at::Tensor& logits, const Launch& launch) {
  const bool aligned = rows_aligned(logits);
  switch (logits.scalar_type()) {
    case at::kFloat: dispatch_width<float>(aligned, launch); break;
    case at::kHalf: dispatch_width<__half>(aligned, launch); break;
    case at::kBFloat16: dispatch_width<__nv_bfloat16>(aligned, launch); break;
    default: TORCH_CHECK_VALUE(false, "unsupported logits dtype ", logits.scalar_type());
  }
}

// ----------------------------------------------------------------------------- sample

std::tuple<at::Tensor, at::Tensor> sample_cuda_impl(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& seed,
    const at::Tensor& offset, bool with_probs) {
  check_logits(logits, "logits", 2, "[N, V]");
  const ParamTensors params{temperature, top_k, top_p, min_p, seed, offset};
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  check_params(params, rows, logits.device());
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  at::Tensor probs =
      at::empty({with_probs ? rows : 0, vocab}, logits.options().dtype(at::kFloat));
  at::Tensor errors = at::empty({rows}, logits.options().dtype(at::kLong));
  if (rows == 0) return {tokens, probs};
  check_grid(rows, "N (rows of logits)");
  const ParamsView view = params_view(params);
  const int mantissa = mantissa_bits(logits.scalar_type());
  dispatch_logits(logits, [&](auto type_tag, auto vec_tag) {
    using T = decltype(type_tag);
    constexpr int kVec = decltype(vec_tag)::value;
    const int threads = team_threads(vocab / kVec);
    sample_kernel<T, kVec><<<static_cast<unsigned>(rows), threads, 0,
                             c10::cuda::getCurrentCUDAStream()>>>(
        static_cast<const T*>(logits.const_data_ptr()), vocab, mantissa, view,
        tokens.mutable_data_ptr<int64_t>(),
        with_probs ? probs.mutable_data_ptr<float>() : nullptr,
        reinterpret_cast<unsigned long long*>(errors.mutable_data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  ErrorContext ctx{OpKind::kSample, params};
  ctx.vocab = vocab;
  raise_device_errors(errors, ctx);
  return {tokens, probs};
}

at::Tensor sample_cuda(const at::Tensor& logits, const at::Tensor& temperature,
                       const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p,
                       const at::Tensor& seed, const at::Tensor& offset) {
  return std::get<0>(
      sample_cuda_impl(logits, temperature, top_k, top_p, min_p, seed, offset, false));
}

std::tuple<at::Tensor, at::Tensor> sample_with_probs_cuda(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& seed,
    const at::Tensor& offset) {
  return sample_cuda_impl(logits, temperature, top_k, top_p, min_p, seed, offset, true);
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
  check_grid(args.batch * args.rows, "B * (K + 1) or B * T");
  dispatch_logits(target_logits, [&](auto type_tag, auto vec_tag) {
    using T = decltype(type_tag);
    constexpr int kVec = decltype(vec_tag)::value;
    const int threads = team_threads(args.vocab / kVec);
    verify_kernel<T, kVec, kTree><<<static_cast<unsigned>(args.batch * args.rows), threads, 0,
                                    c10::cuda::getCurrentCUDAStream()>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

VerifyArgs base_args(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_probs,
                     const ParamTensors& params, bool typical, float posterior_threshold,
                     float posterior_alpha) {
  VerifyArgs a{};
  a.logits = target_logits.const_data_ptr();
  a.batch = target_logits.size(0);
  a.rows = target_logits.size(1);
  a.vocab = target_logits.size(2);
  a.mantissa_bits = mantissa_bits(target_logits.scalar_type());
  a.draft_probs = draft_probs.has_value() ? draft_probs->const_data_ptr<float>() : nullptr;
  a.params = params_view(params);
  a.typical = typical;
  a.posterior_threshold = posterior_threshold;
  a.posterior_alpha = posterior_alpha;
  return a;
}

std::tuple<at::Tensor, at::Tensor> verify_chain_cuda_impl(
    const at::Tensor& draft_tokens, const at::Tensor& num_draft, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs, const ParamTensors& params, bool typical,
    float posterior_threshold, float posterior_alpha) {
  check_chain_inputs(draft_tokens, num_draft, target_logits, draft_probs, params);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const int64_t batch = draft_tokens.size(0);
  const int64_t rows = draft_tokens.size(1) + 1;
  at::Tensor tokens = at::empty({batch, rows}, draft_tokens.options());
  at::Tensor num_accepted = at::empty({batch}, draft_tokens.options());
  Workspace ws(batch, rows, target_logits.options());
  VerifyArgs a = base_args(target_logits, draft_probs, params, typical, posterior_threshold,
                           posterior_alpha);
  a.tokens = draft_tokens.const_data_ptr<int64_t>();
  a.num_draft = num_draft.const_data_ptr<int64_t>();
  ws.fill(a);
  a.out_tokens = tokens.mutable_data_ptr<int64_t>();
  a.out_nodes = nullptr;
  a.out_num_accepted = num_accepted.mutable_data_ptr<int64_t>();
  launch_verify<false>(a, target_logits);
  ErrorContext ctx{OpKind::kChain, params};
  ctx.tokens = &draft_tokens;
  ctx.num_draft = &num_draft;
  ctx.draft_probs = draft_probs.has_value() ? &*draft_probs : nullptr;
  ctx.vocab = a.vocab;
  raise_device_errors(ws.errors, ctx);
  return {tokens, num_accepted};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_cuda_impl(
    const at::Tensor& tree_tokens, const at::Tensor& parents, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs, const ParamTensors& params, bool typical,
    float posterior_threshold, float posterior_alpha) {
  check_tree_inputs(tree_tokens, parents, target_logits, draft_probs, params);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const int64_t batch = tree_tokens.size(0);
  const int64_t rows = tree_tokens.size(1);
  at::Tensor nodes = at::empty({batch, rows}, tree_tokens.options());
  at::Tensor tokens = at::empty({batch, rows}, tree_tokens.options());
  at::Tensor num_accepted = at::empty({batch}, tree_tokens.options());
  Workspace ws(batch, rows, target_logits.options());
  VerifyArgs a = base_args(target_logits, draft_probs, params, typical, posterior_threshold,
                           posterior_alpha);
  a.tokens = tree_tokens.const_data_ptr<int64_t>();
  a.parents = parents.const_data_ptr<int64_t>();
  ws.fill(a);
  a.out_tokens = tokens.mutable_data_ptr<int64_t>();
  a.out_nodes = nodes.mutable_data_ptr<int64_t>();
  a.out_num_accepted = num_accepted.mutable_data_ptr<int64_t>();
  launch_verify<true>(a, target_logits);
  ErrorContext ctx{OpKind::kTree, params};
  ctx.tokens = &tree_tokens;
  ctx.parents = &parents;
  ctx.draft_probs = draft_probs.has_value() ? &*draft_probs : nullptr;
  ctx.vocab = a.vocab;
  raise_device_errors(ws.errors, ctx);
  return {nodes, tokens, num_accepted};
}

std::tuple<at::Tensor, at::Tensor> verify_chain_cuda(
    const at::Tensor& draft_tokens, const at::Tensor& num_draft, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p,
    const at::Tensor& seed, const at::Tensor& offset) {
  return verify_chain_cuda_impl(draft_tokens, num_draft, target_logits, draft_probs,
                                {temperature, top_k, top_p, min_p, seed, offset}, false, 0.0f,
                                0.0f);
}

std::tuple<at::Tensor, at::Tensor> typical_verify_chain_cuda(
    const at::Tensor& draft_tokens, const at::Tensor& num_draft, const at::Tensor& target_logits,
    const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& min_p, const at::Tensor& seed, const at::Tensor& offset,
    double posterior_threshold, double posterior_alpha) {
  return verify_chain_cuda_impl(draft_tokens, num_draft, target_logits, std::nullopt,
                                {temperature, top_k, top_p, min_p, seed, offset}, true,
                                static_cast<float>(posterior_threshold),
                                static_cast<float>(posterior_alpha));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree_cuda(
    const at::Tensor& tree_tokens, const at::Tensor& parents, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p,
    const at::Tensor& seed, const at::Tensor& offset) {
  return verify_tree_cuda_impl(tree_tokens, parents, target_logits, draft_probs,
                               {temperature, top_k, top_p, min_p, seed, offset}, false, 0.0f,
                               0.0f);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> typical_verify_tree_cuda(
    const at::Tensor& tree_tokens, const at::Tensor& parents, const at::Tensor& target_logits,
    const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& min_p, const at::Tensor& seed, const at::Tensor& offset,
    double posterior_threshold, double posterior_alpha) {
  return verify_tree_cuda_impl(tree_tokens, parents, target_logits, std::nullopt,
                               {temperature, top_k, top_p, min_p, seed, offset}, true,
                               static_cast<float>(posterior_threshold),
                               static_cast<float>(posterior_alpha));
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("sample", &sample_cuda);
  m.impl("sample_with_probs", &sample_with_probs_cuda);
  m.impl("verify_chain", &verify_chain_cuda);
  m.impl("verify_tree", &verify_tree_cuda);
  m.impl("typical_verify_chain", &typical_verify_chain_cuda);
  m.impl("typical_verify_tree", &typical_verify_tree_cuda);
}

}  // namespace specdec
