// csrc/core/: the host/device core, the code the CPU kernels (csrc/*.cpp, built by g++) and the
// CUDA kernels (csrc/cuda/kernels/*.cuh, built by nvcc) share where their logic is the same:
// Philox, logits processing, the verification decisions, tree-mask rows, KV row addressing.
// No torch includes. Functions marked SPECDEC_HD compile for both. This header: small helpers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

namespace specdec {

template <typename T>
SPECDEC_HD T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace specdec
