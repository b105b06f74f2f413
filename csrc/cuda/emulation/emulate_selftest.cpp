// Small kernels with known faults (and their fixed twins) that show each check of the emulator
// at work: python_tests/test_cuda_emulator.py runs them. Not package code.

#include <exception>

#include "cuda/kernels/device_code.cuh"

namespace specdec {
namespace {

constexpr int kThreads = 128;

// Each thread publishes its value in shared memory and reads its neighbour's.
__global__ void neighbour_kernel(const float* in, float* out, bool barrier) {
  SPECDEC_SHARED(float[kThreads], values);
  const int t = threadIdx.x;
  values[t] = in[t];
  if (barrier) __syncthreads();
  out[t] = values[(t + 1) % kThreads];
}

// A warp sum whose shuffle mask leaves out lane 31 (mask = 0x7fffffff) or not.
__global__ void warp_sum_kernel(const float* in, float* out, unsigned mask) {
  float v = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  out[threadIdx.x] = v;
}

// Half the warp shuffles while the other half votes: divergent collectives.
__global__ void divergent_kernel(const float* in, float* out) {
  const int lane = threadIdx.x & 31;
  if (lane < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, in[threadIdx.x], 1);
  } else {
    out[threadIdx.x] = static_cast<float>(__ballot_sync(0xffffffffu, in[threadIdx.x] > 0.0f));
  }
}

// Every thread adds its value to *out with a float atomic.
__global__ void atomic_sum_kernel(const float* in, float* out) { atomicAdd(out, in[threadIdx.x]); }

// Reads `in` one element past the end (`past`) or up to its end.
__global__ void bounds_kernel(const float* in, float* out, int n) {
  const int t = threadIdx.x;
  if (t < n) out[t] = in[t + 1];
}

// A cluster of two blocks: each publishes its block index and reads the other's through
// distributed shared memory, with the cluster barrier (`barrier`) or without.
__global__ void cluster_kernel(float* out, bool barrier) {
  SPECDEC_SHARED(float, mine);
  auto cluster = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) mine = static_cast<float>(blockIdx.x);
  if (barrier) cluster.sync();
  const float other = *cluster.map_shared_rank(&mine, cluster.block_rank() ^ 1);
  if (barrier) cluster.sync();  // no block leaves while the other reads its memory
  if (threadIdx.x == 0) out[blockIdx.x] = other;
}

// Threads of the second warp leave before the barrier the others wait at.
__global__ void early_exit_kernel(float* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// Reads dynamic shared memory at index `at` (its size: kThreads floats).
__global__ void shared_bounds_kernel(float* out, int at) {
  SPECDEC_EXTERN_SHARED(float, dyn);
  dyn[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = dyn[at];
}

}  // namespace
}  // namespace specdec

extern "C" {

// Runs self-test kernel `which` (variant: its fixed twin 0, the fault 1) on in/out [kThreads].
int specdec_emu_selftest(int which, int variant, const float* in, float* out) {
  using namespace specdec;
  try {
    const emu::Dim3 block{kThreads, 1, 1};
    const bool fault = variant != 0;
    switch (which) {
      case 0:
        emu::launch({1, 1, 1}, block, 0, 1, [&] { neighbour_kernel(in, out, !fault); });
        break;
      case 1:
        emu::launch({1, 1, 1}, block, 0, 1,
                    [&] { warp_sum_kernel(in, out, fault ? 0x7fffffffu : 0xffffffffu); });
        break;
      case 2:
        emu::launch({1, 1, 1}, block, 0, 1, [&] { divergent_kernel(in, out); });
        break;
      case 3:
        emu::launch({1, 1, 1}, block, 0, 1, [&] { atomic_sum_kernel(in, out); });
        break;
      case 4:
        emu::launch({1, 1, 1}, block, 0, 1,
                    [&] { bounds_kernel(in, out, fault ? kThreads : kThreads - 1); });
        break;
      case 5:
        emu::launch({2, 1, 1}, block, 0, 2, [&] { cluster_kernel(out, !fault); });
        break;
      case 6:
        emu::launch({1, 1, 1}, block, 0, 1, [&] { early_exit_kernel(out); });
        break;
      case 7:
        emu::launch({1, 1, 1}, block, kThreads * sizeof(float), 1,
                    [&] { shared_bounds_kernel(out, fault ? kThreads : kThreads - 1); });
        break;
      default:
        emu::fail("no such self-test");
    }
  } catch (const std::exception& e) {
    emu::fail(e.what());
  }
  return 0;
}

}  // extern "C"
