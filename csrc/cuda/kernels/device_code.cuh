// What device code needs from the compiler, for nvcc and for the host-side emulator.
//
// SPECDEC_DEVICE_CODE is defined when device code is being compiled: by nvcc, or by a host
// compiler with SPECDEC_EMULATE_CUDA defined (csrc/cuda/emulation/cuda_emulator.h then runs the
// kernels on the CPU, for tests on machines without a GPU). In both:
//   SPECDEC_DEVICE                    marks device helper functions (force-inlined by nvcc);
//   SPECDEC_DEVICE_FUNCTION           marks a device function of a header that nvcc inlines as
//                                     it sees fit; static, since several launchers include the
//                                     header and nvcc gives each such function a host stub
//                                     (inline in the emulator, which links the kernels'
//                                     translation units into one library);
//   SPECDEC_SHARED(type, name)        declares a kernel's static shared variable;
//   SPECDEC_EXTERN_SHARED(type, name) declares its dynamic shared memory (type name[]);
//   SPECDEC_CLUSTERS                  is defined where thread-block clusters exist (sm_90+,
//                                     and the emulator).
#pragma once

#if defined(SPECDEC_EMULATE_CUDA)
#include "cuda/emulation/cuda_emulator.h"
#endif

#if defined(__CUDACC__) || defined(SPECDEC_EMULATE_CUDA)
#define SPECDEC_DEVICE_CODE 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>
#endif

#if defined(SPECDEC_EMULATE_CUDA)
#define SPECDEC_DEVICE inline
#define SPECDEC_DEVICE_FUNCTION inline
#define SPECDEC_CLUSTERS 1
#elif defined(__CUDACC__)
#include <cooperative_groups.h>
#define SPECDEC_DEVICE __device__ __forceinline__
#define SPECDEC_DEVICE_FUNCTION static __device__
// torch's extension build compiles CUDA as C++17, which has no std::type_identity_t; the
// alias lets an array type such as float[32] name a __shared__ variable.
namespace specdec_detail {
template <class T> struct identity { using type = T; };
template <class T> using identity_t = typename identity<T>::type;
}  // namespace specdec_detail
#define SPECDEC_SHARED(type, name) __shared__ ::specdec_detail::identity_t<type> name
#define SPECDEC_EXTERN_SHARED(type, name) extern __shared__ __align__(128) type name[]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SPECDEC_CLUSTERS 1
#endif
#endif
