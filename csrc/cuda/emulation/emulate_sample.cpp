// The sample kernel (cuda/kernels/sampling_kernels.cuh) on the emulator, launched as
// cuda/sampling.cu launches it (team_launch.h).

#include <exception>

#include "cuda/emulation/team_launch.h"

extern "C" {

// sample / sample_with_probs of logits [rows, vocab] (dtype 0 float32, 1 float16, 2
// bfloat16); params: temperature, top_k, top_p, min_p, seed, offset ([rows] each); probs may be
// null; device: SMs, major, shared memory per SM and per block; info (out): see report().
int specdec_emu_sample(const void* logits, int dtype, long rows, long vocab, void** params,
                       int64_t* tokens, float* probs, int64_t* errors, const int* device,
                       int* info) {
  using namespace specdec;
  try {
    if (rows == 0) return 0;
    const ParamPointers p = params_of(params);
    const DeviceLimits limits = limits_of(device);
    const int mantissa = mantissa_of(dtype);
    dispatch_logits(dtype, logits, vocab, [&](auto type_tag, auto vec_tag) {
      using T = decltype(type_tag);
      constexpr int kVec = decltype(vec_tag)::value;
      uint32_t smem = 0;
      const TeamArgs ta = plan_team(rows, vocab, sizeof(T), kVec, Elem<T>::kTable, limits, smem);
      report(ta, smem, kVec, info);
      launch_teams(&sample_kernel<T, kVec>, rows, ta, smem, static_cast<const T*>(logits),
                   static_cast<int64_t>(vocab), mantissa, p, ta, tokens, probs,
                   reinterpret_cast<unsigned long long*>(errors));
    });
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

}  // extern "C"
