// Helpers shared by host (CPU kernels) and device code. No torch includes: these headers
// compile under g++ for the CPU kernels and under nvcc for the CUDA ones.
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
