// CPU kernels of the verification ops: one task per request. Rows are processed lazily, in the
// order the decision needs them (core/verify.h holds the decision logic, shared with CUDA),
// so a request whose first draft is rejected processes one row; every row the request owns is
// still checked for NaN/+Inf, so errors do not depend on the random decisions.

// Lets g++ if-convert the clamps of specdec_exp and vectorise the per-token loops; no IEEE
// result changes (nothing here relies on floating-point traps).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/full.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "core/verify.h"
#include "sampling_common.h"
#include "sampling_cpu.h"

namespace specdec {
namespace {

// Output pointers of one request.
struct RequestOutput {
  int64_t* tokens;
  int64_t* nodes;  // nullptr for chains
  int64_t* num_accepted;
};

// Per-task buffers indexed by node.
struct NodeScratch {
  std::vector<float> normalisers;
  std::vector<uint8_t> passed;
  std::vector<int32_t> depth;
  std::vector<int64_t> next_token;
  std::vector<int64_t> siblings;
  std::vector<int64_t> last_child;
  std::vector<uint8_t> checked;  // the row's validity is known
  std::vector<uint8_t> invalid;  // the row has NaN/+Inf or no finite value

  void reset(int64_t num_nodes) {
    normalisers.assign(num_nodes, 0.0f);
    passed.assign(num_nodes, 0);
    depth.assign(num_nodes, -1);
    next_token.assign(num_nodes, -1);
    checked.assign(num_nodes, 0);
    invalid.assign(num_nodes, 0);
  }

  // Loads node j's row into `row` (copy and scan in one pass); false if it is invalid.
  template <typename scalar_t>
  bool load(CpuRow& row, const scalar_t* logits, int64_t j, int64_t vocab, int mantissa) {
    const rows::Scan scan = row.load(logits + j * vocab, vocab, mantissa);
    checked[j] = 1;
    invalid[j] = !scan.valid();
    return scan.valid();
  }
};

// Chains need no preparation; trees get their next-sibling table (one pass over parents).
inline void prepare_layout(ChainLayout&, NodeScratch&) {}

inline void prepare_layout(TreeLayout& layout, NodeScratch& scratch) {
  scratch.siblings.assign(layout.num_nodes, -1);
  scratch.last_child.assign(layout.num_nodes, -1);
  for (int64_t c = layout.num_nodes - 1; c >= 1; --c) {
    const int64_t p = layout.parents[c];
    if (p < 0) continue;
    scratch.siblings[c] = scratch.last_child[p];
    scratch.last_child[p] = c;
  }
  layout.siblings = scratch.siblings.data();
}

// Lossless recursive rejection sampling, walking down from the root.
template <typename scalar_t, typename Layout>
void walk_rejection(const Layout& layout, const scalar_t* logits, int64_t vocab, int mantissa,
                    const RowParams& params, bool has_draft_probs, CpuRow& row,
                    NodeScratch& scratch, const RequestOutput& out) {
  int64_t node = 0, accepted = 0;
  while (true) {
    if (!scratch.load(row, logits, node, vocab, mantissa)) return;  // reported by the caller
    row.process(params, /*with_entropy=*/false);
    const SamplingDecision d = decide_sampling_node(layout, row, params, node, has_draft_probs,
                                                    scratch.normalisers.data());
    if (d.accepted_child < 0) {
      out.tokens[accepted] = d.next_token;
      break;
    }
    if (out.nodes != nullptr) out.nodes[accepted] = d.accepted_child;
    out.tokens[accepted] = layout.token(d.accepted_child);
    ++accepted;
    node = d.accepted_child;
  }
  *out.num_accepted = accepted;
}

// Greedy and typical acceptance: the longest path whose every node passes its parent's test.
template <typename scalar_t, typename Layout>
void walk_longest_path(const Layout& layout, int64_t num_nodes, const scalar_t* logits,
                       const rows::Scan* scans, int64_t vocab, int mantissa,
                       const RowParams& params,
                       const AcceptanceRule& rule, CpuRow& row, NodeScratch& scratch,
                       const RequestOutput& out) {
  const bool greedy = params.greedy();
  for (int64_t j = 0; j < num_nodes; ++j) {
    if (!layout.is_node(j)) continue;
    const bool reached =
        j == 0 || (scratch.depth[layout.parent(j)] >= 0 && scratch.passed[j] != 0);
    if (!reached) continue;
    scratch.depth[j] = j == 0 ? 0 : scratch.depth[layout.parent(j)] + 1;
    if (greedy) {
      row.load_greedy(vocab, scans[j]);
    } else {
      if (!scratch.load(row, logits, j, vocab, mantissa)) return;  // reported by the caller
      row.process(params, /*with_entropy=*/true);
    }
    const float threshold =
        greedy ? 0.0f
               : row.typical_threshold_for(rule.posterior_threshold, rule.posterior_alpha);
    if (!judge_children(layout, row, j, greedy, threshold, scratch.passed.data())) {
      const float u =
          uniforms_at(params.seed, params.offset, static_cast<uint32_t>(j), kStreamVerify).sample;
      scratch.next_token[j] = row.draw_target(u);
    }
  }
  const uint8_t* passed = scratch.passed.data();
  const int64_t last = deepest_accepted_node(
      layout, num_nodes, [passed](int64_t c) { return passed[c] != 0; }, scratch.depth.data());
  const int32_t length = scratch.depth[last];
  write_path(layout, last, length, out.nodes, out.tokens);
  out.tokens[length] = scratch.next_token[last];
  *out.num_accepted = length;
}

// Inputs of one call, shared by chains and trees.
struct VerifyCall {
  const at::Tensor& target_logits;  // [B, R, V]
  const std::optional<at::Tensor>& draft_probs;
  const ParamPointers& params;
  AcceptanceRule rule;
};

// Validation of a request's draft tokens and draft probabilities at them (node j drafted from
// draft row `row`); returns the smallest error code.
inline uint64_t check_draft(int64_t token, int64_t vocab, const float* draft_row, int64_t index) {
  if (token < 0 || token >= vocab) return encode_error(kErrDraftToken, index);
  if (draft_row != nullptr) {
    const float q = draft_row[token];
    if (!(q >= 0.0f && q <= 1.0f)) return encode_error(kErrDraftProb, index);
  }
  return kNoError;
}

template <typename scalar_t, typename MakeLayout>
void verify_requests_cpu(const VerifyCall& call, MakeLayout make_layout, int64_t draft_row_shift,
                         int64_t* tokens, int64_t tokens_cols, int64_t* nodes,
                         int64_t* num_accepted, std::vector<uint64_t>& errors) {
  const int64_t batch = call.target_logits.size(0);
  const int64_t rows = call.target_logits.size(1);
  const int64_t vocab = call.target_logits.size(2);
  const int mantissa = mantissa_bits(call.target_logits.scalar_type());
  const scalar_t* logits = call.target_logits.const_data_ptr<scalar_t>();
  const float* draft_probs =
      call.draft_probs.has_value() ? call.draft_probs->const_data_ptr<float>() : nullptr;
  const int64_t draft_rows = call.draft_probs.has_value() ? call.draft_probs->size(1) : 0;

  // Pass 1, greedy requests: validity and argmax of every node row (all a greedy row needs),
  // rows spread over the threads, or each row split over them when there are fewer rows than
  // threads. Other requests copy and scan a row in one pass when they reach it (pass 2).
  std::vector<rows::Scan> scans(batch * rows);
  std::vector<uint8_t> scan_now(batch * rows, 0);
  for (int64_t b = 0; b < batch; ++b) {
    if (errors[b] != kNoError || !call.params.at(b).greedy()) continue;
    const auto layout = make_layout(b);
    for (int64_t j = 0; j < rows; ++j) scan_now[b * rows + j] = layout.is_node(j);
  }
  const int64_t threads = at::get_num_threads();
  const bool split_rows = batch * rows < threads;
  at::parallel_for(0, batch * rows, split_rows ? batch * rows + 1 : 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      if (scan_now[i]) scans[i] = scan_row(logits + i * vocab, vocab, split_rows);
  });

  // Pass 2: the decisions, one request per task, or requests one after another with each row
  // split over the threads when there are fewer requests than threads. Every row a request
  // owns is checked (rows the decisions never reached are scanned afterwards), and the first
  // invalid one is reported, so errors do not depend on the random decisions.
  const bool split_requests = batch < threads;
  auto verify_request = [&](CpuRow& row, NodeScratch& scratch, int64_t b) {
    if (errors[b] != kNoError) return;
    auto layout = make_layout(b);
    const scalar_t* logits_b = logits + b * rows * vocab;
    const rows::Scan* scans_b = scans.data() + b * rows;
    const RowParams p = call.params.at(b);
    scratch.reset(rows);
    if (p.greedy()) {
      for (int64_t j = 0; j < rows; ++j) {
        scratch.checked[j] = 1;
        scratch.invalid[j] = layout.is_node(j) && !scans_b[j].valid();
      }
    }
    bool valid = true;
    for (int64_t j = 0; j < rows; ++j) valid = valid && !scratch.invalid[j];
    if (valid) {
      row.set_draft_probs(
          draft_probs == nullptr ? nullptr : draft_probs + b * draft_rows * vocab, draft_row_shift);
      prepare_layout(layout, scratch);
      const RequestOutput out{tokens + b * tokens_cols,
                              nodes == nullptr ? nullptr : nodes + b * rows, num_accepted + b};
      if (p.greedy() || call.rule.typical) {
        walk_longest_path(layout, rows, logits_b, scans_b, vocab, mantissa, p, call.rule, row,
                          scratch, out);
      } else {
        walk_rejection(layout, logits_b, vocab, mantissa, p, draft_probs != nullptr, row, scratch,
                       out);
      }
    }
    for (int64_t j = 0; j < rows; ++j) {
      if (!layout.is_node(j)) continue;
      if (!scratch.checked[j])
        scratch.invalid[j] = !scan_row(logits_b + j * vocab, vocab, split_requests).valid();
      if (scratch.invalid[j]) {
        errors[b] = encode_error(kErrLogits, j);
        return;
      }
    }
  };
  if (split_requests) {
    CpuRow row;
    row.set_parallel(true);
    NodeScratch scratch;
    for (int64_t b = 0; b < batch; ++b) verify_request(row, scratch, b);
    return;
  }
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    CpuRow row;
    NodeScratch scratch;
    for (int64_t b = begin; b < end; ++b) verify_request(row, scratch, b);
  });
}

std::vector<uint64_t> check_all_params(const ParamPointers& params, int64_t batch) {
  std::vector<uint64_t> errors(batch, kNoError);
  for (int64_t b = 0; b < batch; ++b) {
    const uint32_t kind = check_row_params(params.at(b));
    if (kind != kErrNone) errors[b] = encode_error(kind, 0);
  }
  return errors;
}

// ----------------------------------------------------------------------------- chains

ChainResult verify_chain_cpu(const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                             const at::Tensor& target_logits,
                             const std::optional<at::Tensor>& draft_probs,
                             const ParamTensors& params, const AcceptanceRule& rule) {
  check_chain_inputs(draft_tokens, num_draft, target_logits, draft_probs, params);
  const int64_t batch = draft_tokens.size(0);
  const int64_t k = draft_tokens.size(1);
  const int64_t vocab = target_logits.size(2);

  at::Tensor tokens = at::full({batch, k + 1}, -1, draft_tokens.options());
  at::Tensor num_accepted = at::full({batch}, 0, draft_tokens.options());
  const ParamPointers pointers = param_pointers(params);
  std::vector<uint64_t> errors = check_all_params(pointers, batch);
  const int64_t* drafts = draft_tokens.const_data_ptr<int64_t>();
  const int64_t* counts = num_draft.const_data_ptr<int64_t>();
  const float* q = draft_probs.has_value() ? draft_probs->const_data_ptr<float>() : nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    if (errors[b] != kNoError) continue;
    if (counts[b] < 0 || counts[b] > k) {
      errors[b] = encode_error(kErrNumDraft, 0);
      continue;
    }
    // The smallest error code of the request, as the CUDA kernel reports it.
    for (int64_t i = 0; i < counts[b]; ++i) {
      const auto error =
          check_draft(drafts[b * k + i], vocab, q == nullptr ? nullptr : q + (b * k + i) * vocab, i);
      if (error < errors[b]) errors[b] = error;
    }
  }
  const VerifyCall call{target_logits, draft_probs, pointers, rule};
  auto make_layout = [&](int64_t b) { return ChainLayout{drafts + b * k, counts[b]}; };
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, target_logits.scalar_type(),
                                  "verify_chain_cpu", [&] {
    verify_requests_cpu<scalar_t>(call, make_layout, /*draft_row_shift=*/-1,
                                  tokens.mutable_data_ptr<int64_t>(), k + 1, nullptr,
                                  num_accepted.mutable_data_ptr<int64_t>(), errors);
  });
  const ErrorContext ctx =
      chain_error_context(params, draft_tokens, num_draft, draft_probs, vocab);
  raise_first_error(errors.data(), batch, ctx);
  return {tokens, num_accepted};
}

// ----------------------------------------------------------------------------- trees

TreeResult verify_tree_cpu(const at::Tensor& tree_tokens, const at::Tensor& parents,
                           const at::Tensor& target_logits,
                           const std::optional<at::Tensor>& draft_probs,
                           const ParamTensors& params, const AcceptanceRule& rule) {
  check_tree_inputs(tree_tokens, parents, target_logits, draft_probs, params);
  const int64_t batch = tree_tokens.size(0);
  const int64_t num_nodes = tree_tokens.size(1);
  const int64_t vocab = target_logits.size(2);

  at::Tensor nodes = at::full({batch, num_nodes}, -1, tree_tokens.options());
  at::Tensor tokens = at::full({batch, num_nodes}, -1, tree_tokens.options());
  at::Tensor num_accepted = at::full({batch}, 0, tree_tokens.options());
  const ParamPointers pointers = param_pointers(params);
  std::vector<uint64_t> errors = check_all_params(pointers, batch);
  const int64_t* toks = tree_tokens.const_data_ptr<int64_t>();
  const int64_t* pars = parents.const_data_ptr<int64_t>();
  const float* q = draft_probs.has_value() ? draft_probs->const_data_ptr<float>() : nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    if (errors[b] != kNoError) continue;
    const int64_t* par = pars + b * num_nodes;
    uint64_t code = kNoError;
    for (int64_t j = 0; j < num_nodes; ++j) {
      const uint32_t kind = check_tree_node(par, j);
      uint64_t here = kNoError;
      if (kind != kErrNone) {
        here = encode_error(kind, j);
      } else if (j > 0 && par[j] != -2) {
        here = check_draft(toks[b * num_nodes + j], vocab,
                           q == nullptr ? nullptr : q + (b * num_nodes + j) * vocab, j);
      }
      code = here < code ? here : code;
    }
    errors[b] = code;
  }
  const VerifyCall call{target_logits, draft_probs, pointers, rule};
  auto make_layout = [&](int64_t b) {
    return TreeLayout{toks + b * num_nodes, pars + b * num_nodes, num_nodes};
  };
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, target_logits.scalar_type(),
                                  "verify_tree_cpu", [&] {
    verify_requests_cpu<scalar_t>(call, make_layout, /*draft_row_shift=*/0,
                                  tokens.mutable_data_ptr<int64_t>(), num_nodes,
                                  nodes.mutable_data_ptr<int64_t>(),
                                  num_accepted.mutable_data_ptr<int64_t>(), errors);
  });
  const ErrorContext ctx =
      tree_error_context(params, tree_tokens, parents, draft_probs, vocab);
  raise_first_error(errors.data(), batch, ctx);
  return {nodes, tokens, num_accepted};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify_chain", &verify_chain_op<verify_chain_cpu>);
  m.impl("verify_tree", &verify_tree_op<verify_tree_cpu>);
  m.impl("typical_verify_chain", &typical_verify_chain_op<verify_chain_cpu>);
  m.impl("typical_verify_tree", &typical_verify_tree_op<verify_tree_cpu>);
}

}  // namespace specdec
