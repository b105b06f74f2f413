// The quantized linears of one decoding step of the default model (30 layers of q/k/v, o,
// gate/up, down as int4 group 32 with mins; the LM head int8 group 32), weights in memory
// (~115 MB, past the last-level cache), for an A/B of two versions of csrc/cpu_qdot.h in one
// process (run.sh): the versions alternate call by call, so the machine's noise falls on both.
#pragma once

namespace ab {
struct Step {
  // Milliseconds of one step at M rows on instruction-set level `level` (cpu_simd.h), 2 threads.
  virtual double run(int M, int level) = 0;
  virtual ~Step() {}
};
Step* make_old();
Step* make_new();
}  // namespace ab
