// What device code needs from the compiler, for nvcc and for the host-side emulator.
//
// SPECDEC_DEVICE_CODE is defined when device code is being compiled: by nvcc, or by a host
// compiler with SPECDEC_EMULATE_CUDA defined (csrc/cuda/emulation/cuda_emulator.h then runs the
// kernels on the CPU, for tests on machines without a GPU). SPECDEC_DEVICE marks device helper
// functions and SPECDEC_EXTERN_SHARED declares a kernel's dynamic shared memory in both.
#pragma once

#if defined(SPECDEC_EMULATE_CUDA)
#include "cuda/emulation/cuda_emulator.h"
#endif

#if defined(__CUDACC__) || defined(SPECDEC_EMULATE_CUDA)
#define SPECDEC_DEVICE_CODE 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#endif

#if defined(SPECDEC_EMULATE_CUDA)
#define SPECDEC_DEVICE inline
#elif defined(__CUDACC__)
#define SPECDEC_DEVICE __device__ __forceinline__
#define SPECDEC_EXTERN_SHARED(type, name) extern __shared__ __align__(128) type name[]
#endif
