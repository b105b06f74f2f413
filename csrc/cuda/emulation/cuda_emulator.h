// A small CUDA emulator for testing kernels on a machine without a GPU (host compiler only).
//
// Each CTA of a launch runs its threads as fibers (ucontext) on one OS thread, CTAs one after
// another. A thread runs until it reaches a synchronising operation (__syncthreads, __syncwarp,
// a shuffle, ldmatrix, mma.sync); when every thread is blocked, the scheduler completes the
// collectives whose warps have all 32 lanes at the same operation and the CTA barrier when every
// live thread is at it. Anything else is reported as an error: a deadlock, lanes of a warp at
// different collectives (divergence), a barrier some threads exited before.
//
// Memory rules are checked where the hardware would fault or misbehave: cp.async and ldmatrix
// addresses must be 16-byte aligned, shared addresses must lie inside the CTA's shared memory,
// and a cp.async source must lie inside a registered global buffer (register_global).
//
// Two schedules expose different races (Mode): in Mode::Lockstep every warp advances one
// collective at a time and cp.async data lands in shared memory only when the issuing thread
// waits for its group, so a missing wait (or a missing barrier after it) reads stale data; in
// Mode::Adversarial each warp runs as far as it can before the next one starts and cp.async data
// lands at issue, so a stage refilled while another warp still reads it (a missing barrier
// before the refill) is overwritten under that warp. Either way the result differs from the
// reference. Shared memory starts poisoned (0xff bytes) in every CTA.
//
// Only what csrc/cuda/kernels/*.cuh use is implemented: 1-D blocks, dynamic shared memory, full
// warp masks.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace specdec::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class Op { Running, SyncThreads, SyncWarp, Shfl, Ldmatrix, LdmatrixTrans, Mma, Done };

enum class Mode { Lockstep, Adversarial };

struct PendingCopy {
  unsigned char* dst;
  const unsigned char* src;  // nullptr: zero-fill
  int group;
};

struct Lane {
  ucontext_t context{};
  std::unique_ptr<char[]> stack;
  Dim3 thread_idx;
  Op op = Op::Running;
  // Collective operands and results.
  const void* address = nullptr;
  uint32_t a[4] = {}, b0 = 0, b1 = 0, bits = 0, result[4] = {};
  float c[4] = {};
  int offset = 0;
  bool mma_half = true;
  // cp.async state.
  std::vector<PendingCopy> copies;
  int committed = 0;
};

struct Range {
  const unsigned char* begin;
  const unsigned char* end;
};

struct State {
  Dim3 grid, block, block_idx;
  std::vector<unsigned char> smem;
  std::vector<Lane> lanes;
  ucontext_t scheduler{};
  Lane* current = nullptr;
  std::function<void()> body;
  std::vector<Range> globals;
  Mode mode = Mode::Lockstep;
  std::string error;
};

inline State& state() {
  static State s;
  return s;
}

inline void fail(const std::string& message) {
  State& s = state();
  if (s.error.empty()) {
    s.error = message + " (block " + std::to_string(s.block_idx.x) + "," +
              std::to_string(s.block_idx.y) + ", thread " +
              std::to_string(s.current ? s.current->thread_idx.x : 0) + ")";
  }
}

inline Lane& lane() { return *state().current; }

// Blocks the current fiber at `op` until the scheduler completes it.
inline void block_at(Op op) {
  Lane& l = lane();
  l.op = op;
  swapcontext(&l.context, &state().scheduler);
}

// ---------------------------------------------------------------- memory registry

// Global buffers a kernel may read with cp.async: [ptr, ptr + bytes).
inline void register_global(const void* ptr, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  state().globals.push_back({p, p + bytes});
}

inline void clear_globals() { state().globals.clear(); }

inline bool in_globals(const void* ptr, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  for (const Range& r : state().globals)
    if (p >= r.begin && p + bytes <= r.end) return true;
  return false;
}

inline bool in_smem(const void* ptr, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  const auto& smem = state().smem;
  return p >= smem.data() && p + bytes <= smem.data() + smem.size();
}

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// ---------------------------------------------------------------- cp.async

inline void complete_copy(const PendingCopy& c) {
  if (c.src) {
    std::memcpy(c.dst, c.src, 16);
  } else {
    std::memset(c.dst, 0, 16);
  }
}

inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  if (!aligned16(smem) || !in_smem(smem, 16)) fail("cp.async: bad shared destination");
  if (valid && (!aligned16(gmem) || !in_globals(gmem, 16)))
    fail("cp.async: source outside the registered global buffers or not 16-byte aligned");
  if (!state().error.empty()) return;
  Lane& l = lane();
  PendingCopy c{static_cast<unsigned char*>(smem),
                valid ? static_cast<const unsigned char*>(gmem) : nullptr, l.committed};
  if (state().mode == Mode::Adversarial) {
    complete_copy(c);
  } else {
    l.copies.push_back(c);
  }
}

inline void cp_async_commit() { ++lane().committed; }

inline void cp_async_wait(int pending_groups) {
  Lane& l = lane();
  // Groups with index < committed - pending_groups are complete.
  const int complete_below = l.committed - pending_groups;
  std::vector<PendingCopy> rest;
  for (const PendingCopy& c : l.copies) {
    if (c.group < complete_below) {
      complete_copy(c);
    } else {
      rest.push_back(c);
    }
  }
  l.copies.swap(rest);
}

// ---------------------------------------------------------------- warp collectives

inline uint32_t shfl_xor_bits(uint32_t bits, int offset) {
  Lane& l = lane();
  l.bits = bits;
  l.offset = offset;
  block_at(Op::Shfl);
  return l.result[0];
}

template <typename T>
inline T shfl_xor(T value, int offset) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits = shfl_xor_bits(bits, offset);
  std::memcpy(&value, &bits, 4);
  return value;
}

inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans) {
  if (!aligned16(smem) || !in_smem(smem, 16)) fail("ldmatrix: bad shared row address");
  Lane& l = lane();
  l.address = smem;
  block_at(trans ? Op::LdmatrixTrans : Op::Ldmatrix);
  for (int i = 0; i < 4; ++i) r[i] = l.result[i];
}

inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                      bool half) {
  Lane& l = lane();
  for (int i = 0; i < 4; ++i) {
    l.a[i] = a[i];
    l.c[i] = d[i];
  }
  l.b0 = b0;
  l.b1 = b1;
  l.mma_half = half;
  block_at(Op::Mma);
  for (int i = 0; i < 4; ++i) std::memcpy(&d[i], &l.result[i], 4);
}

inline float b16_to_float(uint16_t bits, bool half) {
  if (half) {
    __half h;
    std::memcpy(&h, &bits, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &bits, 2);
  return __bfloat162float(h);
}

inline uint16_t low(uint32_t x) { return static_cast<uint16_t>(x & 0xffffu); }
inline uint16_t high(uint32_t x) { return static_cast<uint16_t>(x >> 16); }

// Completes the collective every lane of `warp` is blocked at.
inline void resolve_warp(Lane* w, Op op) {
  switch (op) {
    case Op::SyncWarp:
      break;
    case Op::Shfl:
      for (int i = 0; i < 32; ++i) {
        const int src = i ^ w[i].offset;
        if (w[i].offset != w[0].offset) fail("shuffle: lanes disagree on the offset");
        w[i].result[0] = w[src].bits;
      }
      break;
    case Op::Ldmatrix:
    case Op::LdmatrixTrans:
      for (int i = 0; i < 32; ++i) {
        const int g = i / 4, t = i % 4;
        for (int m = 0; m < 4; ++m) {
          uint16_t e0, e1;
          if (op == Op::Ldmatrix) {  // row g, columns 2t, 2t + 1 of matrix m
            const auto* row = static_cast<const unsigned char*>(w[8 * m + g].address);
            std::memcpy(&e0, row + 4 * t, 2);
            std::memcpy(&e1, row + 4 * t + 2, 2);
          } else {  // column g, rows 2t, 2t + 1 of matrix m
            const auto* r0 = static_cast<const unsigned char*>(w[8 * m + 2 * t].address);
            const auto* r1 = static_cast<const unsigned char*>(w[8 * m + 2 * t + 1].address);
            std::memcpy(&e0, r0 + 2 * g, 2);
            std::memcpy(&e1, r1 + 2 * g, 2);
          }
          w[i].result[m] = static_cast<uint32_t>(e0) | (static_cast<uint32_t>(e1) << 16);
        }
      }
      break;
    case Op::Mma: {
      const bool half = w[0].mma_half;
      float A[16][16], B[16][8], C[16][8];
      for (int i = 0; i < 32; ++i) {
        if (w[i].mma_half != half) fail("mma: lanes disagree on the type");
        const int g = i / 4, t = i % 4;
        const uint32_t* a = w[i].a;
        A[g][2 * t] = b16_to_float(low(a[0]), half);
        A[g][2 * t + 1] = b16_to_float(high(a[0]), half);
        A[g + 8][2 * t] = b16_to_float(low(a[1]), half);
        A[g + 8][2 * t + 1] = b16_to_float(high(a[1]), half);
        A[g][2 * t + 8] = b16_to_float(low(a[2]), half);
        A[g][2 * t + 9] = b16_to_float(high(a[2]), half);
        A[g + 8][2 * t + 8] = b16_to_float(low(a[3]), half);
        A[g + 8][2 * t + 9] = b16_to_float(high(a[3]), half);
        B[2 * t][g] = b16_to_float(low(w[i].b0), half);
        B[2 * t + 1][g] = b16_to_float(high(w[i].b0), half);
        B[2 * t + 8][g] = b16_to_float(low(w[i].b1), half);
        B[2 * t + 9][g] = b16_to_float(high(w[i].b1), half);
        C[g][2 * t] = w[i].c[0];
        C[g][2 * t + 1] = w[i].c[1];
        C[g + 8][2 * t] = w[i].c[2];
        C[g + 8][2 * t + 1] = w[i].c[3];
      }
      for (int i = 0; i < 32; ++i) {
        const int g = i / 4, t = i % 4;
        const int rows[4] = {g, g, g + 8, g + 8};
        const int cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        for (int e = 0; e < 4; ++e) {
          float acc = C[rows[e]][cols[e]];
          for (int k = 0; k < 16; ++k) acc += A[rows[e]][k] * B[k][cols[e]];
          std::memcpy(&w[i].result[e], &acc, 4);
        }
      }
      break;
    }
    default:
      fail("internal: not a warp collective");
  }
}

inline bool is_warp_op(Op op) {
  return op == Op::SyncWarp || op == Op::Shfl || op == Op::Ldmatrix ||
         op == Op::LdmatrixTrans || op == Op::Mma;
}

inline void fiber_entry() {
  State& s = state();
  s.body();
  s.current->op = Op::Done;
  swapcontext(&s.current->context, &s.scheduler);
}

inline void resume(Lane& l) {
  State& s = state();
  s.current = &l;
  l.op = Op::Running;
  swapcontext(&s.scheduler, &l.context);
}

// Runs one CTA to completion (or to the first error).
inline void run_block() {
  State& s = state();
  constexpr size_t kStack = 256 * 1024;
  const int threads = static_cast<int>(s.block.x);
  if (threads % 32 != 0) throw std::runtime_error("emulator: blockDim.x must be a multiple of 32");
  s.lanes.clear();
  s.lanes.resize(threads);
  for (int i = 0; i < threads; ++i) {
    Lane& l = s.lanes[i];
    l.thread_idx = Dim3{static_cast<unsigned>(i), 0, 0};
    l.stack.reset(new char[kStack]);
    getcontext(&l.context);
    l.context.uc_stack.ss_sp = l.stack.get();
    l.context.uc_stack.ss_size = kStack;
    l.context.uc_link = nullptr;
    makecontext(&l.context, fiber_entry, 0);
  }
  std::vector<bool> runnable(threads, true);
  const int warps = threads / 32;
  // Runs the runnable lanes of warp w until each blocks, then completes the warp's collective
  // if all 32 lanes wait at the same one. Returns whether it completed one.
  auto advance_warp = [&](int w) {
    for (int i = 32 * w; i < 32 * w + 32 && s.error.empty(); ++i) {
      if (!runnable[i]) continue;
      resume(s.lanes[i]);
      runnable[i] = false;
    }
    if (!s.error.empty()) return false;
    Lane* warp = &s.lanes[32 * w];
    const Op op = warp[0].op;
    if (!is_warp_op(op)) return false;
    for (int i = 0; i < 32; ++i)
      if (warp[i].op != op) return false;
    s.current = &warp[0];
    resolve_warp(warp, op);
    for (int i = 0; i < 32; ++i) runnable[32 * w + i] = true;
    return true;
  };
  for (;;) {
    bool progress = false;
    if (s.mode == Mode::Adversarial) {
      // The lowest warp that can move runs on alone until it waits at the barrier or exits.
      for (int w = 0; w < warps && !progress && s.error.empty(); ++w) {
        while (advance_warp(w)) progress = true;
      }
    } else {
      for (int w = 0; w < warps && s.error.empty(); ++w) progress = advance_warp(w) || progress;
    }
    if (!s.error.empty()) return;
    if (progress) continue;
    bool all_done = true, any_done = false, all_at_barrier = true;
    for (const Lane& l : s.lanes) {
      all_done = all_done && l.op == Op::Done;
      any_done = any_done || l.op == Op::Done;
      all_at_barrier = all_at_barrier && l.op == Op::SyncThreads;
    }
    if (all_done) return;
    if (all_at_barrier) {
      for (int i = 0; i < threads; ++i) runnable[i] = true;
      continue;
    }
    s.current = nullptr;
    fail(any_done ? "threads exited while others wait at a barrier or collective"
                  : "deadlock or divergent warp collective");
    return;
  }
}

// Runs `body` (a call of the kernel with its arguments) over the grid.
inline void launch(Dim3 grid, Dim3 block, size_t smem_bytes, std::function<void()> body) {
  State& s = state();
  s.grid = grid;
  s.block = block;
  s.body = std::move(body);
  for (unsigned y = 0; y < grid.y && s.error.empty(); ++y) {
    for (unsigned x = 0; x < grid.x && s.error.empty(); ++x) {
      s.block_idx = Dim3{x, y, 0};
      // Poisoned so that reads of shared memory nothing wrote show up as wrong results.
      s.smem.assign(smem_bytes, 0xff);
      run_block();
    }
  }
  s.lanes.clear();
  s.current = nullptr;
}

inline Dim3 thread_idx() { return state().current->thread_idx; }
inline Dim3 block_idx() { return state().block_idx; }
inline Dim3 block_dim() { return state().block; }
inline Dim3 grid_dim() { return state().grid; }
inline unsigned char* dynamic_smem() { return state().smem.data(); }

}  // namespace specdec::emu

// What the kernels use of CUDA C++, mapped onto the emulator.
#define threadIdx (::specdec::emu::thread_idx())
#define blockIdx (::specdec::emu::block_idx())
#define blockDim (::specdec::emu::block_dim())
#define gridDim (::specdec::emu::grid_dim())
#define __syncthreads() ::specdec::emu::block_at(::specdec::emu::Op::SyncThreads)
#define __syncwarp(...) ::specdec::emu::block_at(::specdec::emu::Op::SyncWarp)
#define __shfl_xor_sync(mask, value, offset) ::specdec::emu::shfl_xor((value), (offset))
#define __trap() ::specdec::emu::fail("__trap")
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define SPECDEC_EXTERN_SHARED(type, name) type* name = ::specdec::emu::dynamic_smem()
