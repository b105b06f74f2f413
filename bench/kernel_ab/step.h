// The linears of one decoding step of the default model (30 layers of q/k/v, o, gate/up, down,
// and the LM head), weights in memory past the last-level cache, for an A/B of two versions of
// the CPU tiles in one process (run.sh): the versions alternate call by call, so the machine's
// noise falls on both. Two kinds: the quantized tiles (csrc/cpu_qdot.h; int4 group 32 with
// mins, the head int8 group 32: ~115 MB) and the float tiles (csrc/cpu_dot.h; fp32: 540 MB).
#pragma once

namespace ab {
struct Step {
  // Milliseconds of one step at M rows on instruction-set level `level` (cpu_simd.h), 2 threads.
  virtual double run(int M, int level) = 0;
  virtual ~Step() {}
};
enum Kind { kQuantized = 0, kFloat = 1 };
Step* make_old(Kind kind);
Step* make_new(Kind kind);
}  // namespace ab
