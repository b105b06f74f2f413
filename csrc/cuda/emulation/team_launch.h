// How the CUDA launchers (cuda/row_teams.cuh) launch the row-team kernels, for the emulator's
// entry points (emulate_sample.cpp, emulate_verify.cpp): the same vector width
// (team_vector_width), team plan (plan_team: cluster size, row slice in shared memory, weight
// table, dynamic shared memory) and grid of teams x cluster size with kTeamThreads per block,
// for the device limits the caller gives.
#pragma once

#include <cstdint>

#include "cuda/kernels/sampling_kernels.cuh"

namespace specdec {

// Explicit mantissa bits of the logits dtype (0 float32, 1 float16, 2 bfloat16), as
// mantissa_bits in sampling_common.h.
inline int mantissa_of(int dtype) { return dtype == 1 ? 10 : dtype == 2 ? 7 : 23; }

// Calls launch(T{}, integral_constant<int, VEC>{}) for the logits dtype and the vector width
// the launcher picks for rows of `vocab` elements starting at `logits`.
template <typename Launch>
void dispatch_logits(int dtype, const void* logits, int64_t vocab, const Launch& launch) {
  const int bytes = dtype == 0 ? 4 : 2;
  const int vec = team_vector_width(vocab * bytes, logits, bytes);
  if (dtype == 0) {
    dispatch_team_width<float>(vec, launch);
  } else if (dtype == 1) {
    dispatch_team_width<__half>(vec, launch);
  } else {
    dispatch_team_width<__nv_bfloat16>(vec, launch);
  }
}

inline DeviceLimits limits_of(const int* device) { return {device[0], device[1], device[2], device[3]}; }

inline ParamPointers params_of(void** p) {
  return {static_cast<const float*>(p[0]), static_cast<const int64_t*>(p[1]),
          static_cast<const float*>(p[2]), static_cast<const float*>(p[3]),
          static_cast<const int64_t*>(p[4]), static_cast<const int64_t*>(p[5])};
}

// info: cluster size, row-slice bytes, weight table, dynamic shared memory, vector width.
inline void report(const TeamArgs& ta, uint32_t smem, int vec, int* info) {
  info[0] = ta.size;
  info[1] = static_cast<int>(ta.cache_bytes);
  info[2] = ta.table;
  info[3] = static_cast<int>(smem);
  info[4] = vec;
}

// `teams` row teams of ta.size blocks each, a cluster per team (launch_teams in row_teams.cuh).
template <typename... Params, typename... Args>
void launch_teams(void (*kernel)(Params...), int64_t teams, const TeamArgs& ta, uint32_t smem,
                  Args... args) {
  emu::launch({static_cast<unsigned>(teams * ta.size), 1, 1}, {kTeamThreads, 1, 1}, smem,
              static_cast<unsigned>(ta.size), [&] { kernel(args...); });
}

}  // namespace specdec
