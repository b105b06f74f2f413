// A CUDA emulator for testing the kernels of csrc/cuda/kernels on a machine without a GPU (host
// compiler only). A test tool: it is never part of the built package.
//
// Execution. A launch runs cluster by cluster (a cluster is one CTA unless the launch asks for
// thread-block clusters); all threads of a cluster run as fibers on one OS thread. A thread runs
// until it reaches a synchronising operation (__syncthreads, a cluster barrier, a warp
// collective: __syncwarp, shuffles, votes, reductions, ldmatrix, mma.sync); when every thread is
// blocked, the scheduler completes each warp collective whose member lanes (its mask) all wait
// at it, each CTA barrier every live thread of its CTA waits at, and the cluster barrier. A
// collective whose mask lacks the calling lane, lanes of one mask at different collectives, a
// barrier some threads exited before, a deadlock: each is an error.
//
// Schedules (Schedule). Lockstep: every warp advances one collective at a time, clusters in
// launch order, cp.async data lands when the issuing thread waits for its group. Adversarial:
// the highest warp that can move runs on alone until it blocks at a barrier, clusters run in
// reverse order, cp.async data lands at issue, and float/double atomic additions are applied in
// reverse order (the memory holds the sum a different order of the same additions gives). A
// missing barrier or wait shows up as a wrong result in one schedule or the other, a result
// that depends on the order of atomics as a difference between them.
//
// Checks. Shared memory is poisoned (0xff bytes) at every cluster's start. Every load and store
// of the kernels (compiled with -fsanitize=thread, whose hooks this emulator implements instead
// of ThreadSanitizer's runtime) is checked: a shared-memory access outside the CTA's static and
// dynamic shared memory, any access to a guard zone around a global buffer (guard_global), and
// a data race on shared memory: two threads touching the same bytes (one writing, not both
// atomically) with no barrier or warp collective between them that orders them (ordering:
// cluster barrier, then CTA barrier, then a collective of their warp). cp.async and ldmatrix
// count as the issuing lane's write and read; distributed shared memory (map_shared_rank) is
// checked the same way. cp.async and ldmatrix addresses must be 16-byte aligned, and a cp.async
// source must lie inside a registered global buffer (register_global).
//
// Only what the kernels use is implemented: 1-D blocks and clusters, dynamic and static shared
// memory, the warp operations below, 32- and 64-bit integer atomics and float/double additions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

namespace specdec::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class Schedule : int { Lockstep = 0, Adversarial = 1 };

// ---------------------------------------------------------------- launching (host side)

// Clears the last error, the registered buffers and guard zones; sets the schedule.
void begin(Schedule schedule);
// A global buffer that cp.async may read: [ptr, ptr + bytes).
void register_global(const void* ptr, size_t bytes);
// A guard zone before (or after) the buffer `name`: any load or store of a kernel inside
// [ptr, ptr + bytes) is an error naming the buffer.
void guard_global(const void* ptr, size_t bytes, const char* name, bool before);
// Runs body (a call of the kernel) over the grid; `cluster` CTAs along x form a cluster.
// Nothing runs once an error was recorded.
void launch(Dim3 grid, Dim3 block, size_t dynamic_smem, unsigned cluster,
            const std::function<void()>& body);
const std::string& error();
inline bool ok() { return error().empty(); }

// ---------------------------------------------------------------- device side

void fail(const std::string& message);
Dim3 thread_idx();
Dim3 block_idx();
Dim3 block_dim();
Dim3 grid_dim();
unsigned char* dynamic_smem();
// Static shared memory of the declaration `site` (one address per site and CTA).
void* static_smem(const void* site, size_t bytes, size_t align);
void sync_threads();
void sync_cluster();
unsigned cluster_rank();
unsigned cluster_size();
// `local`, an address in this CTA's shared memory, in CTA `rank` of the cluster.
void* map_shared_rank(const void* local, unsigned rank);

enum class WarpOp : uint8_t {
  Sync, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, ReduceMin, ReduceMax, ReduceAdd,
  Ldmatrix, LdmatrixTrans, Mma,
};
// One lane's part of a collective over the lanes of `mask`; returns this lane's result.
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);

template <typename T>
T shuffle(WarpOp op, unsigned mask, T value, int arg, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- and 64-bit shuffles only");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = warp_collective(op, mask, bits, arg, width);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

void cp_async_16(void* smem, const void* gmem, bool valid);
void cp_async_commit();
void cp_async_wait(int pending_groups);
void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans);
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool half);

// Atomics (never instrumented as plain accesses: the race check knows them as atomic).
uint32_t atomic_add(uint32_t* p, uint32_t v);
int32_t atomic_add(int32_t* p, int32_t v);
unsigned long long atomic_add(unsigned long long* p, unsigned long long v);
float atomic_add(float* p, float v);
double atomic_add(double* p, double v);
uint32_t atomic_min(uint32_t* p, uint32_t v);
int32_t atomic_min(int32_t* p, int32_t v);
unsigned long long atomic_min(unsigned long long* p, unsigned long long v);
uint32_t atomic_max(uint32_t* p, uint32_t v);
int32_t atomic_max(int32_t* p, int32_t v);
unsigned long long atomic_max(unsigned long long* p, unsigned long long v);

}  // namespace specdec::emu

// ---------------------------------------------------------------- CUDA C++ on the emulator

#define threadIdx (::specdec::emu::thread_idx())
#define blockIdx (::specdec::emu::block_idx())
#define blockDim (::specdec::emu::block_dim())
#define gridDim (::specdec::emu::grid_dim())
#define __syncthreads() ::specdec::emu::sync_threads()
#define __trap() ::specdec::emu::fail("__trap")
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __constant__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __constant__ static
#define __launch_bounds__(...)
#define SPECDEC_EXTERN_SHARED(type, name) type* name = reinterpret_cast<type*>(::specdec::emu::dynamic_smem())
#define SPECDEC_SHARED(type, name)                                                            \
  std::type_identity_t<type>& name = *static_cast<std::type_identity_t<type>*>(               \
      ::specdec::emu::static_smem([]() -> const void* { static const char site = 0; return &site; }(), \
                                  sizeof(type), alignof(type)))

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::specdec::emu::warp_collective(::specdec::emu::WarpOp::Sync, mask, 0, 0, 32);
}
template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
  return ::specdec::emu::shuffle(::specdec::emu::WarpOp::ShflIdx, mask, value, src_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ::specdec::emu::shuffle(::specdec::emu::WarpOp::ShflUp, mask, value, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ::specdec::emu::shuffle(::specdec::emu::WarpOp::ShflDown, mask, value, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return ::specdec::emu::shuffle(::specdec::emu::WarpOp::ShflXor, mask, value, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(::specdec::emu::warp_collective(
      ::specdec::emu::WarpOp::Ballot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(::specdec::emu::warp_collective(::specdec::emu::WarpOp::Any, mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(::specdec::emu::warp_collective(::specdec::emu::WarpOp::All, mask, predicate != 0, 0, 32));
}
inline int __reduce_min_sync(unsigned mask, int value) {
  return static_cast<int>(::specdec::emu::warp_collective(
      ::specdec::emu::WarpOp::ReduceMin, mask, static_cast<uint64_t>(static_cast<int64_t>(value)), 1, 32));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
  return static_cast<unsigned>(::specdec::emu::warp_collective(::specdec::emu::WarpOp::ReduceMin, mask, value, 0, 32));
}
inline int __reduce_max_sync(unsigned mask, int value) {
  return static_cast<int>(::specdec::emu::warp_collective(
      ::specdec::emu::WarpOp::ReduceMax, mask, static_cast<uint64_t>(static_cast<int64_t>(value)), 1, 32));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return static_cast<unsigned>(::specdec::emu::warp_collective(::specdec::emu::WarpOp::ReduceMax, mask, value, 0, 32));
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return static_cast<unsigned>(::specdec::emu::warp_collective(::specdec::emu::WarpOp::ReduceAdd, mask, value, 0, 32));
}

template <typename T, typename U>
T atomicAdd(T* p, U v) { return ::specdec::emu::atomic_add(p, static_cast<T>(v)); }
template <typename T, typename U>
T atomicMin(T* p, U v) { return ::specdec::emu::atomic_min(p, static_cast<T>(v)); }
template <typename T, typename U>
T atomicMax(T* p, U v) { return ::specdec::emu::atomic_max(p, static_cast<T>(v)); }

// Memory order between CTAs needs nothing: the emulator runs clusters one after another.
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T>
T __ldg(const T* p) { return *p; }
template <typename T>
T __ldcg(const T* p) { return *p; }
inline float __uint_as_float(unsigned bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned bits; std::memcpy(&bits, &f, 4); return bits; }
inline float __int_as_float(int bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline int __float_as_int(float f) { int bits; std::memcpy(&bits, &f, 4); return bits; }
// Round-to-nearest float arithmetic: what x86-64 SSE does without contraction (the emulator is
// compiled with -ffp-contract=off).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// Thread-block clusters (sm_90), as cooperative_groups names them.
namespace cooperative_groups {
struct cluster_group {
  void sync() const { ::specdec::emu::sync_cluster(); }
  unsigned block_rank() const { return ::specdec::emu::cluster_rank(); }
  unsigned num_blocks() const { return ::specdec::emu::cluster_size(); }
  template <typename T>
  T* map_shared_rank(T* local, unsigned rank) const {
    return static_cast<T*>(::specdec::emu::map_shared_rank(local, rank));
  }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups
