// CUDA launcher of verify_chain and typical_verify_chain (host side shared in row_teams.cuh).

#include <torch/library.h>

#include "cuda/row_teams.cuh"

namespace specdec {
namespace {

using namespace row_teams;

ChainResult verify_chain_cuda(const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                              const at::Tensor& target_logits,
                              const std::optional<at::Tensor>& draft_probs,
                              const ParamTensors& params, const AcceptanceRule& rule) {
  check_chain_inputs(draft_tokens, num_draft, target_logits, draft_probs, params);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const int64_t batch = draft_tokens.size(0);
  const int64_t rows = draft_tokens.size(1) + 1;
  at::Tensor tokens = at::empty({batch, rows}, draft_tokens.options());
  at::Tensor num_accepted = at::empty({batch}, draft_tokens.options());
  Workspace ws(batch, rows, target_logits.options());
  VerifyArgs a = base_args(target_logits, draft_probs, params, rule);
  a.tokens = draft_tokens.const_data_ptr<int64_t>();
  a.num_draft = num_draft.const_data_ptr<int64_t>();
  ws.fill(a);
  a.out_tokens = tokens.mutable_data_ptr<int64_t>();
  a.out_nodes = nullptr;
  a.out_num_accepted = num_accepted.mutable_data_ptr<int64_t>();
  launch_verify<false>(a, target_logits);
  const ErrorContext ctx =
      chain_error_context(params, draft_tokens, num_draft, draft_probs, a.vocab);
  raise_device_errors(ws.errors, ctx);
  return {tokens, num_accepted};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify_chain", &verify_chain_op<verify_chain_cuda>);
  m.impl("typical_verify_chain", &typical_verify_chain_op<verify_chain_cuda>);
}

}  // namespace specdec
