// CUDA launcher of verify_tree and typical_verify_tree (host side shared in row_teams.cuh).

#include <torch/library.h>

#include "cuda/row_teams.cuh"

namespace specdec {
namespace {

using namespace row_teams;

TreeResult verify_tree_cuda(const at::Tensor& tree_tokens, const at::Tensor& parents,
                            const at::Tensor& target_logits,
                            const std::optional<at::Tensor>& draft_probs,
                            const ParamTensors& params, const AcceptanceRule& rule) {
  check_tree_inputs(tree_tokens, parents, target_logits, draft_probs, params);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const int64_t batch = tree_tokens.size(0);
  const int64_t rows = tree_tokens.size(1);
  at::Tensor nodes = at::empty({batch, rows}, tree_tokens.options());
  at::Tensor tokens = at::empty({batch, rows}, tree_tokens.options());
  at::Tensor num_accepted = at::empty({batch}, tree_tokens.options());
  Workspace ws(batch, rows, target_logits.options());
  VerifyArgs a = base_args(target_logits, draft_probs, params, rule);
  a.tokens = tree_tokens.const_data_ptr<int64_t>();
  a.parents = parents.const_data_ptr<int64_t>();
  ws.fill(a);
  a.out_tokens = tokens.mutable_data_ptr<int64_t>();
  a.out_nodes = nodes.mutable_data_ptr<int64_t>();
  a.out_num_accepted = num_accepted.mutable_data_ptr<int64_t>();
  launch_verify<true>(a, target_logits);
  const ErrorContext ctx =
      tree_error_context(params, tree_tokens, parents, draft_probs, a.vocab);
  raise_device_errors(ws.errors, ctx);
  return {nodes, tokens, num_accepted};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("verify_tree", &verify_tree_op<verify_tree_cuda>);
  m.impl("typical_verify_tree", &typical_verify_tree_op<verify_tree_cuda>);
}

}  // namespace specdec
