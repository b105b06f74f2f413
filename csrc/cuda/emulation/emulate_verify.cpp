// The verification kernel (cuda/kernels/sampling_kernels.cuh) on the emulator, launched as
// cuda/verify_*.cu launch it (team_launch.h), with the launcher's workspace.

#include <cstring>
#include <exception>
#include <vector>

#include "cuda/emulation/team_launch.h"

namespace specdec {
namespace {

// The verify workspace as the launcher allocates it: uninitialised (here: a byte pattern no
// field means), errors all ones, counters zero.
struct Workspace {
  std::vector<int64_t> accepted_child, next_token, siblings;
  std::vector<float> normalisers;
  std::vector<uint8_t> passed;
  std::vector<int32_t> depth;
  std::vector<unsigned> counters;

  explicit Workspace(size_t nodes, size_t batch) : counters(batch, 0u) {
    poison(accepted_child, nodes);
    poison(next_token, nodes);
    poison(siblings, nodes);
    poison(normalisers, nodes);
    poison(passed, nodes);
    poison(depth, nodes);
  }
  template <typename T>
  static void poison(std::vector<T>& v, size_t n) {
    v.resize(n);
    std::memset(v.data(), 0xA5, n * sizeof(T));
  }
};

}  // namespace
}  // namespace specdec

extern "C" {

// verify_chain (tree = 0: tokens = draft_tokens [B, R-1], num_draft [B]) or verify_tree
// (tree = 1: tokens = tree_tokens [B, R], parents [B, R]) of target logits [B, R, V], draft
// probabilities or null, typical acceptance (eps, alpha) or not. Outputs: tokens [B, R], nodes
// [B, R] (trees), num_accepted [B], errors [B] (the workspace's error codes).
int specdec_emu_verify(int tree, const void* logits, int dtype, long batch, long rows, long vocab,
                       const int64_t* tokens, const int64_t* num_draft, const int64_t* parents,
                       const float* draft_probs, void** params, int typical, double eps,
                       double alpha, int64_t* out_tokens, int64_t* out_nodes,
                       int64_t* out_num_accepted, int64_t* errors, const int* device, int* info) {
  using namespace specdec;
  try {
    if (batch * rows == 0) return 0;
    Workspace ws(static_cast<size_t>(batch * rows), static_cast<size_t>(batch));
    for (long b = 0; b < batch; ++b) errors[b] = -1;
    VerifyArgs a{};
    a.logits = logits;
    a.batch = batch;
    a.rows = rows;
    a.vocab = vocab;
    a.mantissa_bits = mantissa_of(dtype);
    a.tokens = tokens;
    a.num_draft = num_draft;
    a.parents = parents;
    a.draft_probs = draft_probs;
    a.params = params_of(params);
    a.typical = typical != 0;
    a.posterior_threshold = static_cast<float>(eps);
    a.posterior_alpha = static_cast<float>(alpha);
    a.accepted_child = ws.accepted_child.data();
    a.next_token = ws.next_token.data();
    a.siblings = ws.siblings.data();
    a.normalisers = ws.normalisers.data();
    a.passed = ws.passed.data();
    a.depth = ws.depth.data();
    a.errors = reinterpret_cast<unsigned long long*>(errors);
    a.counters = ws.counters.data();
    a.out_tokens = out_tokens;
    a.out_nodes = tree ? out_nodes : nullptr;
    a.out_num_accepted = out_num_accepted;
    const DeviceLimits limits = limits_of(device);
    dispatch_logits(dtype, logits, vocab, [&](auto type_tag, auto vec_tag) {
      using T = decltype(type_tag);
      constexpr int kVec = decltype(vec_tag)::value;
      uint32_t smem = 0;
      const TeamArgs ta =
          plan_team(batch * rows, vocab, sizeof(T), kVec, Elem<T>::kTable, limits, smem);
      report(ta, smem, kVec, info);
      if (tree) {
        launch_teams(&verify_kernel<T, kVec, true>, batch * rows, ta, smem, a, ta);
      } else {
        launch_teams(&verify_kernel<T, kVec, false>, batch * rows, ta, smem, a, ta);
      }
    });
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

}  // extern "C"
