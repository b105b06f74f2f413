// Argument checks and error reporting shared by the CPU (sampling.cpp, verify.cpp) and CUDA
// (cuda/sampling.cu, cuda/verify_*.cu) launchers of the sampling and verification ops.
//
// Value errors (bad parameters, malformed trees, draft ids out of range, NaN/+Inf logits) are
// found per request by the kernels themselves (core/sampling.h: ErrorKind) and encoded as
// (kind << 32) | index; the launcher raises a ValueError for the first request with an error,
// decoded here, so CPU and CUDA report the same message.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "checks.h"
#include "core/sampling.h"

namespace specdec {

// The per-request sampling parameters of an op call (SamplingParams plus offset), all [B].
struct ParamTensors {
  const at::Tensor& temperature;
  const at::Tensor& top_k;
  const at::Tensor& top_p;
  const at::Tensor& min_p;
  const at::Tensor& seed;
  const at::Tensor& offset;
};

inline void check_params(const ParamTensors& p, int64_t batch, c10::Device device) {
  check_tensor(p.temperature, "temperature", {batch}, at::kFloat, device);
  check_tensor(p.top_k, "top_k", {batch}, at::kLong, device);
  check_tensor(p.top_p, "top_p", {batch}, at::kFloat, device);
  check_tensor(p.min_p, "min_p", {batch}, at::kFloat, device);
  check_tensor(p.seed, "seed", {batch}, at::kLong, device);
  check_tensor(p.offset, "offset", {batch}, at::kLong, device);
}

// Logits: float32/float16/bfloat16, contiguous, `dim` dimensions, a non-empty vocabulary.
inline void check_logits(const at::Tensor& logits, const char* name, int64_t dim,
                         const char* layout) {
  TORCH_CHECK_VALUE(logits.dim() == dim, name, " must have shape ", layout, ", got ",
                    logits.sizes());
  const auto t = logits.scalar_type();
  TORCH_CHECK_VALUE(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, name,
                    " must be float32, float16 or bfloat16, got ", t);
  TORCH_CHECK_VALUE(logits.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_VALUE(logits.size(-1) >= 1 && logits.size(-1) <= 0x7fffffff, name,
                    " must have a vocabulary of 1 to 2^31 - 1 tokens, got shape ", logits.sizes());
}

// A sample / sample_with_probs call: logits [N, V], parameters [N].
inline void check_sample_args(const at::Tensor& logits, const ParamTensors& params) {
  check_logits(logits, "logits", 2, "[N, V]");
  check_params(params, logits.size(0), logits.device());
}

// draft_probs, when given: float32 [B, R, V] matching the logits' vocabulary.
inline void check_draft_probs(const std::optional<at::Tensor>& draft_probs, int64_t batch,
                              int64_t rows, int64_t vocab, c10::Device device) {
  if (!draft_probs.has_value()) return;
  check_tensor(*draft_probs, "draft_probs", {batch, rows, vocab}, at::kFloat, device);
}

// Shapes, dtypes and devices of a verify_chain call: draft_tokens [B, K] int64, num_draft [B]
// int64, target_logits [B, K+1, V], draft_probs [B, K, V] float32 or None, parameters [B].
inline void check_chain_inputs(const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                               const at::Tensor& target_logits,
                               const std::optional<at::Tensor>& draft_probs,
                               const ParamTensors& params) {
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, "draft_tokens must have shape [B, K], got ",
                    draft_tokens.sizes());
  const int64_t batch = draft_tokens.size(0);
  const int64_t k = draft_tokens.size(1);
  check_logits(target_logits, "target_logits", 3, "[B, K+1, V]");
  TORCH_CHECK_VALUE(target_logits.size(0) == batch && target_logits.size(1) == k + 1,
                    "target_logits must have shape [B, K+1, V] = [", batch, ", ", k + 1,
                    ", V], got ", target_logits.sizes());
  const auto device = target_logits.device();
  check_tensor(draft_tokens, "draft_tokens", {batch, k}, at::kLong, device);
  check_tensor(num_draft, "num_draft", {batch}, at::kLong, device);
  check_draft_probs(draft_probs, batch, k, target_logits.size(2), device);
  check_params(params, batch, device);
}

// Shapes, dtypes and devices of a verify_tree call: tree_tokens and parents [B, T] int64
// (T >= 1), target_logits [B, T, V], draft_probs [B, T, V] float32 or None, parameters [B].
inline void check_tree_inputs(const at::Tensor& tree_tokens, const at::Tensor& parents,
                              const at::Tensor& target_logits,
                              const std::optional<at::Tensor>& draft_probs,
                              const ParamTensors& params) {
  TORCH_CHECK_VALUE(tree_tokens.dim() == 2 && tree_tokens.size(1) >= 1,
                    "tree_tokens must have shape [B, T] with T >= 1, got ", tree_tokens.sizes());
  const int64_t batch = tree_tokens.size(0);
  const int64_t num_nodes = tree_tokens.size(1);
  check_logits(target_logits, "target_logits", 3, "[B, T, V]");
  TORCH_CHECK_VALUE(target_logits.size(0) == batch && target_logits.size(1) == num_nodes,
                    "target_logits must have shape [B, T, V] = [", batch, ", ", num_nodes,
                    ", V], got ", target_logits.sizes());
  const auto device = target_logits.device();
  check_tensor(tree_tokens, "tree_tokens", {batch, num_nodes}, at::kLong, device);
  check_tensor(parents, "parents", {batch, num_nodes}, at::kLong, device);
  check_draft_probs(draft_probs, batch, num_nodes, target_logits.size(2), device);
  check_params(params, batch, device);
}

// Explicit mantissa bits of a logits dtype's float32 form (for the radix select's last round).
inline int mantissa_bits(c10::ScalarType t) {
  return t == at::kHalf ? 10 : (t == at::kBFloat16 ? 7 : 23);
}

// Pointers to the parameters' data (on their device).
inline ParamPointers param_pointers(const ParamTensors& p) {
  return {p.temperature.const_data_ptr<float>(), p.top_k.const_data_ptr<int64_t>(),
          p.top_p.const_data_ptr<float>(),       p.min_p.const_data_ptr<float>(),
          p.seed.const_data_ptr<int64_t>(),      p.offset.const_data_ptr<int64_t>()};
}

enum class OpKind { kSample, kChain, kTree };

// What a message needs to name the offending values; tensors may live on any device (read
// only on the error path).
struct ErrorContext {
  OpKind op;
  const ParamTensors& params;
  const at::Tensor* tokens = nullptr;       // draft_tokens [B, K] or tree_tokens [B, T]
  const at::Tensor* num_draft = nullptr;    // chain
  const at::Tensor* parents = nullptr;      // tree
  const at::Tensor* draft_probs = nullptr;  // when given
  int64_t vocab = 0;
};

// What the error messages of a verify_chain / verify_tree call name.
inline ErrorContext chain_error_context(const ParamTensors& params, const at::Tensor& draft_tokens,
                                        const at::Tensor& num_draft,
                                        const std::optional<at::Tensor>& draft_probs,
                                        int64_t vocab) {
  ErrorContext c{OpKind::kChain, params};
  c.tokens = &draft_tokens;
  c.num_draft = &num_draft;
  c.draft_probs = draft_probs.has_value() ? &*draft_probs : nullptr;
  c.vocab = vocab;
  return c;
}

inline ErrorContext tree_error_context(const ParamTensors& params, const at::Tensor& tree_tokens,
                                       const at::Tensor& parents,
                                       const std::optional<at::Tensor>& draft_probs,
                                       int64_t vocab) {
  ErrorContext c{OpKind::kTree, params};
  c.tokens = &tree_tokens;
  c.parents = &parents;
  c.draft_probs = draft_probs.has_value() ? &*draft_probs : nullptr;
  c.vocab = vocab;
  return c;
}

template <typename T>
T element(const at::Tensor& t, std::initializer_list<int64_t> index) {
  at::Tensor e = t;
  for (int64_t i : index) e = e.select(0, i);
  return e.item<T>();
}

inline std::string describe_error(uint64_t code, int64_t b, const ErrorContext& ctx) {
  const auto kind = static_cast<uint32_t>(code >> 32);
  const auto index = static_cast<int64_t>(static_cast<uint32_t>(code));
  const bool chain = ctx.op == OpKind::kChain;
  const char* token_name = chain ? "draft_tokens" : "tree_tokens";
  std::ostringstream m;
  m << "request " << b << ": ";
  switch (kind) {
    case kErrTemperature:
      m << "temperature[" << b << "] = " << element<float>(ctx.params.temperature, {b})
        << " is invalid: use 0 for greedy or a positive finite value (>= 3e-39)";
      break;
    case kErrTopP:
      m << "top_p[" << b << "] = " << element<float>(ctx.params.top_p, {b})
        << " must be in (0, 1] (1 disables top-p)";
      break;
    case kErrMinP:
      m << "min_p[" << b << "] = " << element<float>(ctx.params.min_p, {b})
        << " must be in [0, 1) (0 disables min-p)";
      break;
    case kErrNumDraft:
      m << "num_draft[" << b << "] = " << element<int64_t>(*ctx.num_draft, {b})
        << " must be in [0, K = " << ctx.tokens->size(1) << "]";
      break;
    case kErrRoot:
      m << "parents[" << b << ", 0] = " << element<int64_t>(*ctx.parents, {b, 0})
        << ": node 0 must be the root (parent -1)";
      break;
    case kErrSecondRoot:
      m << "parents[" << b << ", " << index
        << "] = -1: more than one root (only node 0 may have parent -1)";
      break;
    case kErrParentOrder:
      m << "parents[" << b << ", " << index << "] = " << element<int64_t>(*ctx.parents, {b, index})
        << ": a parent must come before its child (0 <= parent < " << index
        << "), which also rules out cycles; -2 marks padding";
      break;
    case kErrPaddedParent: {
      const auto p = element<int64_t>(*ctx.parents, {b, index});
      m << "parents[" << b << ", " << index << "] = " << p << " points to a padding node (parents["
        << b << ", " << p << "] = -2)";
      break;
    }
    case kErrDraftToken:
      m << token_name << "[" << b << ", " << index << "] = "
        << element<int64_t>(*ctx.tokens, {b, index}) << " is out of range for vocabulary size "
        << ctx.vocab;
      break;
    case kErrDraftProb: {
      const auto x = element<int64_t>(*ctx.tokens, {b, index});
      m << "draft_probs[" << b << ", " << index << ", " << x << "] = "
        << element<float>(*ctx.draft_probs, {b, index, x})
        << " (the drafted token's probability) must lie in [0, 1]";
      break;
    }
    case kErrLogits:
      if (ctx.op == OpKind::kSample) {
        m << "logits[" << b << "]";
      } else {
        m << "target_logits[" << b << ", " << index << "]";
      }
      m << " contains NaN or +Inf, or has no finite value (-Inf is allowed: probability 0)";
      break;
    default:
      m << "unknown error code " << code;
  }
  return m.str();
}

// Raises a ValueError for the first request whose code is not kNoError.
inline void raise_first_error(const uint64_t* codes, int64_t batch, const ErrorContext& ctx) {
  for (int64_t b = 0; b < batch; ++b) {
    if (codes[b] != kNoError) TORCH_CHECK_VALUE(false, describe_error(codes[b], b, ctx));
  }
}

// ----------------------------------------------------------------------------- entry points

// How a verification op accepts drafts (core/verify.h): lossless rejection sampling, or
// typical acceptance with its threshold min(eps, alpha * exp(-H)).
struct AcceptanceRule {
  bool typical = false;
  float posterior_threshold = 0.0f;  // eps
  float posterior_alpha = 0.0f;      // alpha
};

inline AcceptanceRule typical_rule(double posterior_threshold, double posterior_alpha) {
  return {true, static_cast<float>(posterior_threshold), static_cast<float>(posterior_alpha)};
}

using SampleResult = std::tuple<at::Tensor, at::Tensor>;
using ChainResult = std::tuple<at::Tensor, at::Tensor>;
using TreeResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using SampleImpl = SampleResult (*)(const at::Tensor& logits, const ParamTensors& params,
                                    bool with_probs);
using ChainImpl = ChainResult (*)(const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                                  const at::Tensor& target_logits,
                                  const std::optional<at::Tensor>& draft_probs,
                                  const ParamTensors& params, const AcceptanceRule& rule);
using TreeImpl = TreeResult (*)(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                const at::Tensor& target_logits,
                                const std::optional<at::Tensor>& draft_probs,
                                const ParamTensors& params, const AcceptanceRule& rule);

// The schemas' argument lists (csrc/registration.cpp), forwarded to a device's implementation
// of the op family: each device (CPU: sampling.cpp, verify.cpp; CUDA: cuda/sampling.cu,
// cuda/verify_*.cu) defines one function per family and registers these, e.g. m.impl("sample", &sample_op<sample_cpu>).
template <SampleImpl kImpl>
at::Tensor sample_op(const at::Tensor& logits, const at::Tensor& temperature,
                     const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& min_p,
                     const at::Tensor& seed, const at::Tensor& offset) {
  return std::get<0>(kImpl(logits, {temperature, top_k, top_p, min_p, seed, offset}, false));
}

template <SampleImpl kImpl>
SampleResult sample_with_probs_op(const at::Tensor& logits, const at::Tensor& temperature,
                                  const at::Tensor& top_k, const at::Tensor& top_p,
                                  const at::Tensor& min_p, const at::Tensor& seed,
                                  const at::Tensor& offset) {
  return kImpl(logits, {temperature, top_k, top_p, min_p, seed, offset}, true);
}

template <ChainImpl kImpl>
ChainResult verify_chain_op(const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                            const at::Tensor& target_logits,
                            const std::optional<at::Tensor>& draft_probs,
                            const at::Tensor& temperature, const at::Tensor& top_k,
                            const at::Tensor& top_p, const at::Tensor& min_p,
                            const at::Tensor& seed, const at::Tensor& offset) {
  return kImpl(draft_tokens, num_draft, target_logits, draft_probs,
               {temperature, top_k, top_p, min_p, seed, offset}, AcceptanceRule{});
}

template <ChainImpl kImpl>
ChainResult typical_verify_chain_op(const at::Tensor& draft_tokens, const at::Tensor& num_draft,
                                    const at::Tensor& target_logits,
                                    const at::Tensor& temperature, const at::Tensor& top_k,
                                    const at::Tensor& top_p, const at::Tensor& min_p,
                                    const at::Tensor& seed, const at::Tensor& offset,
                                    double posterior_threshold, double posterior_alpha) {
  return kImpl(draft_tokens, num_draft, target_logits, std::nullopt,
               {temperature, top_k, top_p, min_p, seed, offset},
               typical_rule(posterior_threshold, posterior_alpha));
}

template <TreeImpl kImpl>
TreeResult verify_tree_op(const at::Tensor& tree_tokens, const at::Tensor& parents,
                          const at::Tensor& target_logits,
                          const std::optional<at::Tensor>& draft_probs,
                          const at::Tensor& temperature, const at::Tensor& top_k,
                          const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& seed,
                          const at::Tensor& offset) {
  return kImpl(tree_tokens, parents, target_logits, draft_probs,
               {temperature, top_k, top_p, min_p, seed, offset}, AcceptanceRule{});
}

template <TreeImpl kImpl>
TreeResult typical_verify_tree_op(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                  const at::Tensor& target_logits, const at::Tensor& temperature,
                                  const at::Tensor& top_k, const at::Tensor& top_p,
                                  const at::Tensor& min_p, const at::Tensor& seed,
                                  const at::Tensor& offset, double posterior_threshold,
                                  double posterior_alpha) {
  return kImpl(tree_tokens, parents, target_logits, std::nullopt,
               {temperature, top_k, top_p, min_p, seed, offset},
               typical_rule(posterior_threshold, posterior_alpha));
}

}  // namespace specdec
