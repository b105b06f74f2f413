// CUDA kernels of the sampling and verification ops: a row team (team.cuh) per row of logits,
// processed by TeamRow (team_row.cuh). No torch includes.
//
// Verification launches one team per (request, node): every node team decides its own node
// (which child is accepted, or the next token if none: core/verify.h, the same code as the
// CPU kernels) and writes a few words to a workspace; the last team of a request to finish
// (counted with an atomic) assembles the request's outputs by walking those decisions.
//
// Errors: each team checks what it reads (parameters, its tree entry, its draft token and draft
// probability, its row for NaN/+Inf) and records the smallest error code of its request in
// `errors` (kNoError = all ones); a request with an error gets num_accepted 0 and tokens -1.
#pragma once

#include <cstdint>

#include "core/philox.h"
#include "core/sampling.h"
#include "core/verify.h"
#include "cuda/kernels/device_code.cuh"
#include "cuda/kernels/team.cuh"
#include "cuda/kernels/team_row.cuh"

#if defined(SPECDEC_DEVICE_CODE)

namespace specdec {

// ----------------------------------------------------------------------------- sample

// grid.x = rows * team size; writes tokens[n] (-1 on error), probs[n, :] when probs != nullptr
// (zeros on error) and errors[n] (kNoError or the row's error code).
template <typename T, int VEC>
__global__ void __launch_bounds__(kTeamThreads, 2)
    sample_kernel(const T* __restrict__ logits, int64_t vocab, int mantissa, ParamPointers params,
                  TeamArgs ta, int64_t* __restrict__ tokens, float* __restrict__ probs,
                  unsigned long long* __restrict__ errors) {
  SPECDEC_SHARED(TeamShared, sh);
  SPECDEC_EXTERN_SHARED(unsigned char, dyn);
  Team team{ta.size, static_cast<int>(blockIdx.x % ta.size), 0, sh};
  const int64_t n = blockIdx.x / ta.size;
  const RowParams p = params.at(n);
  uint64_t error = kNoError;
  const uint32_t kind = check_row_params(p);
  TeamRow<T, VEC> row(logits + n * vocab, vocab, mantissa, team, dyn, ta);
  if (kind != kErrNone) {
    error = encode_error(kind, 0);
  } else if (!row.process(p, false)) {
    error = encode_error(kErrLogits, n);
  }
  int64_t token = -1;
  if (error == kNoError) token = row.draw_target(uniforms_at(p.seed, p.offset, 0, kStreamSample).sample);
  if (team.leader()) {
    tokens[n] = token;
    errors[n] = error;
  }
  if (probs != nullptr) {
    if (error == kNoError) {
      row.write_probs(probs + n * vocab);
    } else {
      row.write_zeros(probs + n * vocab);
    }
  }
  team.sync();  // no block leaves while another may still read its shared memory
}

// ----------------------------------------------------------------------------- verify

struct VerifyArgs {
  const void* logits;  // [B, R, V]
  int64_t batch, rows, vocab;
  int mantissa_bits;
  const int64_t* tokens;     // chain: draft_tokens [B, R-1]; tree: tree_tokens [B, R]
  const int64_t* num_draft;  // chain: [B]
  const int64_t* parents;    // tree: [B, R]
  const float* draft_probs;  // chain: [B, R-1, V]; tree: [B, R, V]; or nullptr
  ParamPointers params;
  bool typical;
  float posterior_threshold, posterior_alpha;
  // workspace, [B, R] each (errors and counters [B], initialised to all ones and zeros)
  int64_t* accepted_child;
  int64_t* next_token;
  int64_t* siblings;
  float* normalisers;
  uint8_t* passed;
  int32_t* depth;
  unsigned long long* errors;
  unsigned int* counters;
  // outputs
  int64_t* out_tokens;  // [B, R]
  int64_t* out_nodes;   // tree: [B, R]; chain: nullptr
  int64_t* out_num_accepted;
};

template <bool kTree>
struct LayoutOf;

template <>
struct LayoutOf<false> {
  using type = ChainLayout;
  static constexpr int64_t kDraftRowShift = -1;
  __device__ static ChainLayout make(const VerifyArgs& a, int64_t b) {
    return ChainLayout{a.tokens + b * (a.rows - 1), a.num_draft[b]};
  }
  __device__ static int64_t draft_rows(const VerifyArgs& a) { return a.rows - 1; }
};

template <>
struct LayoutOf<true> {
  using type = TreeLayout;
  static constexpr int64_t kDraftRowShift = 0;
  __device__ static TreeLayout make(const VerifyArgs& a, int64_t b) {
    return TreeLayout{a.tokens + b * a.rows, a.parents + b * a.rows, a.rows};
  }
  __device__ static int64_t draft_rows(const VerifyArgs& a) { return a.rows; }
};

__device__ __forceinline__ uint64_t min_code(uint64_t a, uint64_t b) { return a < b ? a : b; }

// The errors node j of request b can see before reading its row (see the file comment).
template <bool kTree>
__device__ uint64_t node_input_error(const VerifyArgs& a, int64_t b, int64_t j,
                                     const RowParams& p) {
  const uint32_t kind = check_row_params(p);
  if (kind != kErrNone) return encode_error(kind, 0);
  const int64_t draft_rows = LayoutOf<kTree>::draft_rows(a);
  int64_t own_index;  // the index errors of node j's own token are reported at
  if constexpr (kTree) {
    const uint32_t tree_kind = check_tree_node(a.parents + b * a.rows, j);
    if (tree_kind != kErrNone) return encode_error(tree_kind, j);
    own_index = j;
  } else {
    const int64_t nd = a.num_draft[b];
    if (nd < 0 || nd > a.rows - 1) return encode_error(kErrNumDraft, 0);
    own_index = j - 1;
  }
  const auto layout = LayoutOf<kTree>::make(a, b);
  if (!layout.is_node(j)) return kNoError;
  uint64_t error = kNoError;
  if (j > 0) {
    const int64_t x = layout.token(j);
    if (x < 0 || x >= a.vocab) {
      error = encode_error(kErrDraftToken, own_index);
    } else if (a.draft_probs != nullptr) {
      const float q = a.draft_probs[(b * draft_rows + layout.draft_row(j)) * a.vocab + x];
      if (!(q >= 0.0f && q <= 1.0f)) error = encode_error(kErrDraftProb, own_index);
    }
  }
  for (int64_t c = layout.first_child(j); c >= 0; c = layout.next_sibling(c)) {
    const int64_t x = layout.token(c);
    if (x < 0 || x >= a.vocab)
      error = min_code(error, encode_error(kErrDraftToken, kTree ? c : c - 1));
  }
  return error;
}

// Node j's decision, written to the workspace (accepted_child / next_token / passed).
template <typename T, int VEC, bool kTree>
__device__ uint64_t decide_node(const VerifyArgs& a, int64_t b, int64_t j, const RowParams& p,
                                Team& team, unsigned char* dyn, const TeamArgs& ta) {
  using Layout = typename LayoutOf<kTree>::type;
  Layout layout = LayoutOf<kTree>::make(a, b);
  if constexpr (kTree) {  // node j's children are walked once per token: cache their order
    // Every block of the team writes the same values and reads its own writes.
    if (threadIdx.x == 0) cache_siblings(layout, j, a.siblings + b * a.rows);
    __syncthreads();
    layout.siblings = a.siblings + b * a.rows;
  }
  const T* logits = static_cast<const T*>(a.logits) + (b * a.rows + j) * a.vocab;
  TeamRow<T, VEC> row(logits, a.vocab, a.mantissa_bits, team, dyn, ta);
  const bool longest_path = p.greedy() || a.typical;
  if (!row.process(p, /*with_entropy=*/a.typical && !p.greedy()))
    return encode_error(kErrLogits, j);
  const int64_t slot = b * a.rows + j;
  if (longest_path) {
    const float threshold =
        p.greedy() ? 0.0f : row.typical_threshold_for(a.posterior_threshold, a.posterior_alpha);
    const bool any = judge_children(layout, row, j, p.greedy(), threshold, a.passed + b * a.rows);
    int64_t next = -1;
    if (!any) {
      const float u =
          uniforms_at(p.seed, p.offset, static_cast<uint32_t>(j), kStreamVerify).sample;
      next = row.draw_target(u);
    }
    if (team.leader()) a.next_token[slot] = next;
  } else {
    if (a.draft_probs != nullptr) {
      row.draft_probs = a.draft_probs + b * LayoutOf<kTree>::draft_rows(a) * a.vocab;
      row.draft_row_shift = LayoutOf<kTree>::kDraftRowShift;
    }
    const SamplingDecision d = decide_sampling_node(layout, row, p, j, a.draft_probs != nullptr,
                                                    a.normalisers + b * a.rows);
    if (team.leader()) {
      a.accepted_child[slot] = d.accepted_child;
      a.next_token[slot] = d.next_token;
    }
  }
  return kNoError;
}

__device__ __forceinline__ int64_t load_cg(const int64_t* p) {
  return static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(p)));
}

// Run by the last block of request b: outputs from the node decisions.
template <bool kTree>
__device__ void assemble_request(const VerifyArgs& a, int64_t b, const RowParams& p) {
  int64_t* tokens = a.out_tokens + b * a.rows;
  int64_t* nodes = a.out_nodes == nullptr ? nullptr : a.out_nodes + b * a.rows;
  for (int64_t i = threadIdx.x; i < a.rows; i += blockDim.x) {
    tokens[i] = -1;
    if (nodes != nullptr) nodes[i] = -1;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  a.out_num_accepted[b] = 0;
  if (__ldcg(a.errors + b) != kNoError) return;
  const auto layout = LayoutOf<kTree>::make(a, b);
  const int64_t* accepted_child = a.accepted_child + b * a.rows;
  const int64_t* next_token = a.next_token + b * a.rows;
  int64_t length = 0, last = 0;
  if (p.greedy() || a.typical) {
    const uint8_t* passed = a.passed + b * a.rows;
    int32_t* depth = a.depth + b * a.rows;
    last = deepest_accepted_node(
        layout, a.rows, [passed](int64_t c) { return __ldcg(passed + c) != 0; }, depth);
    length = write_path(layout, last, depth[last], nodes, tokens);
  } else {
    for (int64_t c = load_cg(accepted_child); c >= 0; c = load_cg(accepted_child + c)) {
      if (nodes != nullptr) nodes[length] = c;
      tokens[length] = layout.token(c);
      ++length;
      last = c;
    }
  }
  tokens[length] = load_cg(next_token + last);
  a.out_num_accepted[b] = length;
}

// grid.x = B * R * team size: team (b, j) decides node j of request b; the last team of each
// request to finish assembles its outputs (in its rank-0 block).
template <typename T, int VEC, bool kTree>
__global__ void __launch_bounds__(kTeamThreads, 2) verify_kernel(VerifyArgs a, TeamArgs ta) {
  SPECDEC_SHARED(TeamShared, sh);
  SPECDEC_SHARED(bool, is_last);
  SPECDEC_EXTERN_SHARED(unsigned char, dyn);
  Team team{ta.size, static_cast<int>(blockIdx.x % ta.size), 0, sh};
  const int64_t item = blockIdx.x / ta.size;
  const int64_t b = item / a.rows;
  const int64_t j = item % a.rows;
  const RowParams p = a.params.at(b);
  uint64_t error = node_input_error<kTree>(a, b, j, p);
  if (error == kNoError) {
    const auto layout = LayoutOf<kTree>::make(a, b);
    if (layout.is_node(j)) error = decide_node<T, VEC, kTree>(a, b, j, p, team, dyn, ta);
  }
  team.sync();  // the team's decision is written; no block leaves while another reads its memory
  if (team.rank != 0) return;
  if (threadIdx.x == 0) {
    if (error != kNoError) atomicMin(a.errors + b, static_cast<unsigned long long>(error));
    __threadfence();
    is_last = atomicAdd(a.counters + b, 1u) == static_cast<unsigned>(a.rows - 1);
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  assemble_request<kTree>(a, b, p);
}

}  // namespace specdec

#endif  // SPECDEC_DEVICE_CODE
