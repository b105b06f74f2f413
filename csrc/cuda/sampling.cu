// CUDA launcher of sample and sample_with_probs (host side shared in row_teams.cuh).

#include <torch/library.h>

#include "cuda/row_teams.cuh"

namespace specdec {
namespace {

using namespace row_teams;

SampleResult sample_cuda(const at::Tensor& logits, const ParamTensors& params, bool with_probs) {
  check_sample_args(logits, params);
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  at::Tensor probs =
      at::empty({with_probs ? rows : 0, vocab}, logits.options().dtype(at::kFloat));
  at::Tensor errors = at::empty({rows}, logits.options().dtype(at::kLong));
  if (rows == 0) return {tokens, probs};
  const ParamPointers view = param_pointers(params);
  const int mantissa = mantissa_bits(logits.scalar_type());
  const DeviceLimits& info = device_info(logits.get_device());
  dispatch_logits(logits, [&](auto type_tag, auto vec_tag) {
    using T = decltype(type_tag);
    constexpr int kVec = decltype(vec_tag)::value;
    uint32_t smem = 0;
    const TeamArgs ta = plan_team(rows, vocab, sizeof(T), kVec, Elem<T>::kTable, info, smem);
    launch_teams(&sample_kernel<T, kVec>, rows, ta, smem, "N (rows of logits)",
                 static_cast<const T*>(logits.const_data_ptr()), vocab, mantissa, view, ta,
                 tokens.mutable_data_ptr<int64_t>(),
                 with_probs ? probs.mutable_data_ptr<float>() : nullptr,
                 reinterpret_cast<unsigned long long*>(errors.mutable_data_ptr<int64_t>()));
  });
  ErrorContext ctx{OpKind::kSample, params};
  ctx.vocab = vocab;
  raise_device_errors(errors, ctx);
  return {tokens, probs};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("sample", &sample_op<sample_cuda>);
  m.impl("sample_with_probs", &sample_with_probs_op<sample_cuda>);
}

}  // namespace specdec
