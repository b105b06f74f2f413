// The emulator's runtime (see cuda_emulator.h): fibers, the scheduler, warp collectives, shared
// memory, atomics and the access checks behind the -fsanitize=thread hooks. Compiled without
// instrumentation, once; the kernels' translation units are compiled with it.

#include "cuda/emulation/cuda_emulator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace specdec::emu {
namespace {

// ---------------------------------------------------------------- fibers

constexpr size_t kStackBytes = 256 * 1024;

#if defined(__x86_64__)
// Saves the callee-saved registers and the SSE/x87 control words on the current stack, stores
// the stack pointer in *save and continues on the stack `load` (saved the same way). About ten
// instructions: the scheduler switches fibers tens of millions of times per test run, which
// swapcontext (a signal-mask system call per switch) would make minutes.
extern "C" void specdec_emu_switch(void** save, void* load);
asm(R"(
  .text
  .globl specdec_emu_switch
  .type specdec_emu_switch, @function
specdec_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size specdec_emu_switch, .-specdec_emu_switch
)");
#endif

// A fiber's stack: mapped once, reused by every launch, with an inaccessible page below it so
// that an overflow faults instead of corrupting a neighbour.
struct Stack {
  char* base = nullptr;  // the guard page
  size_t bytes = 0;
  Stack() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes = kStackBytes + page;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("emulator: cannot map a fiber stack");
    base = static_cast<char*>(p);
    mprotect(base, page, PROT_NONE);
  }
  ~Stack() { munmap(base, bytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* top() const { return base + bytes; }
};

enum class At : uint8_t { Running, SyncThreads, SyncCluster, Warp, Done };

struct PendingCopy {
  unsigned char* dst;
  const unsigned char* src;  // nullptr: zero-fill
  int group;
};

struct Lane {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t context{};
#endif
  unsigned index = 0;  // in the cluster: cta * block threads + thread
  unsigned cta = 0;    // rank in the cluster
  unsigned thread = 0;
  At at = At::Running;
  // The collective it waits at and its result.
  WarpOp op = WarpOp::Sync;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0, width = 32;
  const void* address = nullptr;
  uint32_t a[4] = {}, b0 = 0, b1 = 0;
  float c[4] = {};
  bool half = true;
  uint64_t result = 0;
  uint32_t out[4] = {};
  uint32_t warp_epoch = 0;  // collectives of its warp it took part in (see Access)
  std::vector<PendingCopy> copies;
  int committed = 0;
};

struct Cta {
  Dim3 block_idx;
  unsigned char* smem = nullptr;  // static area, then dynamic, then a red zone
  uint32_t epoch = 0;             // barriers passed
  bool exited = false;
};

// Shared memory of a CTA: static area (the sites' variables), dynamic, then a red zone.
constexpr size_t kStaticCapacity = 48 * 1024;
constexpr size_t kRedZone = 1024;

// One access for the race check: who, and the synchronisation state it happened in.
struct Access {
  uint32_t cluster_epoch = 0;  // global counter: cluster starts and cluster barriers
  uint32_t cta_epoch = 0;
  uint32_t warp_epoch = 0;
  uint16_t lane = 0;   // Lane::index
  uint8_t flags = 0;   // kAtomic, kManyReaders, kManyWarps
  uint8_t bytes = 0;   // byte mask within the word
};
constexpr uint8_t kAtomic = 1, kManyReaders = 2, kManyWarps = 4;

struct Shadow {
  Access write, read;
};

struct GuardZone {
  uintptr_t begin, end;
  std::string name;  // of the buffer it guards
  bool before;       // the zone lies before the buffer (else after it)
};

struct FloatAdd {  // a float/double atomic addition logged for the adversarial order
  void* address;
  bool is_double;
  double initial;
  std::vector<double> addends;
};

struct State {
  Schedule schedule = Schedule::Lockstep;
  std::string error;
  std::vector<std::pair<uintptr_t, uintptr_t>> globals;
  std::vector<GuardZone> guards;
  // The launch.
  Dim3 grid, block;
  unsigned cluster = 1;
  size_t dynamic_bytes = 0, cta_bytes = 0;
  const std::function<void()>* body = nullptr;
  std::map<const void*, size_t> static_sites;
  size_t static_used = 0;
  // The cluster that runs.
  std::vector<std::unique_ptr<Stack>> stacks;
  std::vector<Lane> lanes;
  std::vector<Cta> ctas;
  std::vector<uint32_t> warp_counters;
  std::vector<unsigned char> smem;  // every CTA's area, back to back
  std::vector<Shadow> shadow;       // per 4-byte word of smem
  uintptr_t smem_begin = 0, smem_bytes = 0;
  uint32_t cluster_epoch = 0;
  Lane* current = nullptr;
  bool on_fiber = false;  // a lane runs (else the scheduler does, maybe on a lane's behalf)
  std::vector<FloatAdd> float_adds;
#if defined(__x86_64__)
  void* scheduler_sp = nullptr;
#else
  ucontext_t scheduler{};
#endif
};

State& state() {
  static State s;
  return s;
}

std::string where(const Lane* l) {
  const State& s = state();
  if (l == nullptr) return "";
  const Cta& c = s.ctas[l->cta];
  return " (block " + std::to_string(c.block_idx.x) + "," + std::to_string(c.block_idx.y) +
         ", thread " + std::to_string(l->thread) + ")";
}

void switch_to_scheduler(Lane& l) {
#if defined(__x86_64__)
  specdec_emu_switch(&l.sp, state().scheduler_sp);
#else
  swapcontext(&l.context, &state().scheduler);
#endif
}

void block_at(At at) {
  Lane& l = *state().current;
  l.at = at;
  switch_to_scheduler(l);
}

[[noreturn]] void fiber_main() {
  State& s = state();
  (*s.body)();
  s.current->at = At::Done;
  switch_to_scheduler(*s.current);
  __builtin_unreachable();
}

void start_fiber(Lane& l, Stack& stack) {
#if defined(__x86_64__)
  auto* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack.top()) & ~uintptr_t{15});
  *--sp = 0;  // fiber_main's return address (it never returns); rsp % 16 == 8 at its entry
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);
  for (int r = 0; r < 6; ++r) *--sp = 0;  // rbp, rbx, r12-r15
  *--sp = 0x1F80ull | (0x037Full << 32);   // default MXCSR and x87 control word
  l.sp = sp;
#else
  getcontext(&l.context);
  l.context.uc_stack.ss_sp = stack.base;
  l.context.uc_stack.ss_size = stack.bytes;
  l.context.uc_link = nullptr;
  makecontext(&l.context, reinterpret_cast<void (*)()>(&fiber_main), 0);
#endif
}

void resume(Lane& l) {
  State& s = state();
  s.current = &l;
  s.on_fiber = true;
  l.at = At::Running;
#if defined(__x86_64__)
  specdec_emu_switch(&s.scheduler_sp, l.sp);
#else
  swapcontext(&s.scheduler, &l.context);
#endif
  s.on_fiber = false;
  s.current = nullptr;
}

// ---------------------------------------------------------------- access checks

bool in_smem(const void* p, size_t bytes) {
  const State& s = state();
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a >= s.smem_begin && a + bytes <= s.smem_begin + s.smem_bytes;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether an access `a` (earlier) and the current lane's `b` are ordered by a barrier or a
// collective of their warp.
bool ordered(const Access& a, const Access& b) {
  const State& s = state();
  if (a.cluster_epoch != b.cluster_epoch) return true;
  const unsigned threads = s.block.x;
  if (a.lane / threads != b.lane / threads) return false;
  if (a.cta_epoch != b.cta_epoch) return true;
  if (a.lane / 32 != b.lane / 32) return false;
  return a.warp_epoch != b.warp_epoch;
}

std::string lane_name(unsigned index) {
  const State& s = state();
  return "thread " + std::to_string(index % s.block.x) + " of block " +
         std::to_string(s.ctas[index / s.block.x].block_idx.x);
}

void race(const char* what, uintptr_t address, unsigned other) {
  const State& s = state();
  const size_t offset = address - s.smem_begin;
  char text[160];
  std::snprintf(text, sizeof(text), "shared-memory race: %s at byte %zu of block %u's shared memory, ",
                what, offset % s.cta_bytes,
                s.ctas[offset / s.cta_bytes].block_idx.x);
  fail(std::string(text) + "unordered with " + lane_name(other) +
       " (no barrier or warp collective between them)");
}

// Whether a concurrent reader recorded in `r` (the latest one; kManyReaders: others read in the
// same window, kManyWarps: from more than one warp) conflicts with the write `now`.
bool readers_conflict(const Access& r, const Access& now) {
  if (r.lane != now.lane && !ordered(r, now)) return true;
  if (!(r.flags & kManyReaders)) return false;
  Access other = r;  // stands for the readers not recorded
  if (r.flags & kManyWarps) {
    other.lane = static_cast<uint16_t>(now.lane ^ 32);  // another warp (of this CTA or the next)
  } else if (r.lane / 32 == now.lane / 32) {
    other.lane = static_cast<uint16_t>(now.lane ^ 1);  // another lane of the writer's warp
  } else {
    return false;  // r's warp: ordered like r
  }
  return !ordered(other, now);
}

// Checks and records an access of `bytes` bytes at smem address `a` by the current lane.
void smem_access(uintptr_t a, size_t bytes, bool write, bool atomic) {
  State& s = state();
  Lane& l = *s.current;
  const size_t offset = a - s.smem_begin;
  const size_t cta = offset / s.cta_bytes;
  const size_t in_cta = offset % s.cta_bytes;
  const bool in_static = in_cta + bytes <= s.static_used;
  const bool in_dynamic = in_cta >= kStaticCapacity && in_cta + bytes <= kStaticCapacity + s.dynamic_bytes;
  if (!in_static && !in_dynamic) {
    const bool dynamic = in_cta >= kStaticCapacity;
    fail(std::string("shared-memory ") + (write ? "write" : "read") +
         " outside the block's shared memory: " + std::to_string(bytes) + " bytes at byte " +
         std::to_string(dynamic ? in_cta - kStaticCapacity : in_cta) + " of the " +
         (dynamic ? "dynamic area of " + std::to_string(s.dynamic_bytes)
                  : "static area of " + std::to_string(s.static_used)) + " bytes");
    return;
  }
  if (s.ctas[cta].exited) {
    fail("distributed shared memory access to block " + std::to_string(s.ctas[cta].block_idx.x) +
         ", which has exited");
    return;
  }
  Access now;
  now.cluster_epoch = s.cluster_epoch;
  now.cta_epoch = s.ctas[l.cta].epoch;
  now.warp_epoch = l.warp_epoch;
  now.lane = static_cast<uint16_t>(l.index);
  now.flags = atomic ? kAtomic : 0;
  for (uintptr_t word = a & ~uintptr_t{3}; word < a + bytes; word += 4) {
    const uintptr_t lo = std::max<uintptr_t>(word, a), hi = std::min<uintptr_t>(word + 4, a + bytes);
    now.bytes = static_cast<uint8_t>(((1u << (hi - lo)) - 1u) << (lo - word));
    Shadow& sh = s.shadow[(word - s.smem_begin) / 4];
    const Access& w = sh.write;
    const bool both_atomic = w.flags & now.flags & kAtomic;
    if ((w.bytes & now.bytes) && w.lane != now.lane && !both_atomic && !ordered(w, now)) {
      race(write ? "a write after another thread's write" : "a read of another thread's write",
           word, w.lane);
      return;
    }
    Access& r = sh.read;
    if (write) {
      if ((r.bytes & now.bytes) && !(r.flags & now.flags & kAtomic) && readers_conflict(r, now)) {
        race("a write after another thread's read", word, r.lane);
        return;
      }
      sh.write = now;
      continue;
    }
    if (r.bytes == 0 || ordered(r, now)) {
      r = now;  // the earlier readers are ordered before this one
    } else if (r.lane == now.lane) {
      const uint8_t many = r.flags & (kManyReaders | kManyWarps);
      const uint8_t bytes_read = r.bytes;
      r = now;
      r.flags |= many;
      r.bytes |= bytes_read;
    } else {
      const bool many_warps = r.lane / 32 != now.lane / 32 || (r.flags & kManyWarps);
      const uint8_t bytes_read = r.bytes;
      r = now;
      r.flags |= kManyReaders | (many_warps ? kManyWarps : 0);
      r.bytes |= bytes_read;
    }
  }
}

void check_access(const void* p, size_t bytes, bool write) {
  State& s = state();
  if (s.current == nullptr || !s.error.empty()) return;
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a - s.smem_begin < s.smem_bytes) {
    smem_access(a, bytes, write, false);
    return;
  }
  for (const GuardZone& g : s.guards) {
    if (a < g.end && a + bytes > g.begin) {
      const uintptr_t distance = g.before ? g.end - a : a - g.begin;
      fail(std::string(write ? "write" : "read") + " out of bounds: " + std::to_string(bytes) +
           " bytes at " + std::to_string(distance) + " bytes " +
           (g.before ? "before the start of " : "past the end of ") + g.name);
      return;
    }
  }
}

// ---------------------------------------------------------------- cp.async

void land(const PendingCopy& c) {
  if (state().current != nullptr) smem_access(reinterpret_cast<uintptr_t>(c.dst), 16, true, false);
  if (c.src) {
    std::memcpy(c.dst, c.src, 16);
  } else {
    std::memset(c.dst, 0, 16);
  }
}

bool in_globals(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [begin, end] : state().globals)
    if (a >= begin && a + bytes <= end) return true;
  return false;
}

// ---------------------------------------------------------------- warp collectives

float b16_to_float(uint16_t bits, bool half) {
  if (half) {
    __half h;
    std::memcpy(&h, &bits, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &bits, 2);
  return __bfloat162float(h);
}

uint16_t low(uint32_t x) { return static_cast<uint16_t>(x & 0xffffu); }
uint16_t high(uint32_t x) { return static_cast<uint16_t>(x >> 16); }

void resolve_ldmatrix(Lane* w, bool trans) {
  State& s = state();
  for (int i = 0; i < 32; ++i) {  // each lane reads the 16-byte row it addressed
    s.current = &w[i];
    smem_access(reinterpret_cast<uintptr_t>(w[i].address), 16, false, false);
  }
  for (int i = 0; i < 32; ++i) {
    const int g = i / 4, t = i % 4;
    for (int m = 0; m < 4; ++m) {
      uint16_t e0, e1;
      if (!trans) {  // row g, columns 2t, 2t + 1 of matrix m
        const auto* row = static_cast<const unsigned char*>(w[8 * m + g].address);
        std::memcpy(&e0, row + 4 * t, 2);
        std::memcpy(&e1, row + 4 * t + 2, 2);
      } else {  // column g, rows 2t, 2t + 1 of matrix m
        const auto* r0 = static_cast<const unsigned char*>(w[8 * m + 2 * t].address);
        const auto* r1 = static_cast<const unsigned char*>(w[8 * m + 2 * t + 1].address);
        std::memcpy(&e0, r0 + 2 * g, 2);
        std::memcpy(&e1, r1 + 2 * g, 2);
      }
      w[i].out[m] = static_cast<uint32_t>(e0) | (static_cast<uint32_t>(e1) << 16);
    }
  }
}

void resolve_mma(Lane* w) {
  const bool half = w[0].half;
  float A[16][16], B[16][8], C[16][8];
  for (int i = 0; i < 32; ++i) {
    if (w[i].half != half) fail("mma: lanes disagree on the type");
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
      std::memcpy(&w[i].out[e], &acc, 4);
    }
  }
}

const char* op_name(WarpOp op) {
  static const char* names[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                "__reduce_min_sync", "__reduce_max_sync", "__reduce_add_sync",
                                "ldmatrix", "ldmatrix.trans", "mma.sync"};
  return names[static_cast<int>(op)];
}

// The source lane of a shuffle for lane i (-1: the lane keeps its own value).
int shuffle_source(const Lane& l, int i) {
  const int width = l.width;
  const int segment = i & ~(width - 1);
  switch (l.op) {
    case WarpOp::ShflIdx: return segment + (l.arg & (width - 1));
    case WarpOp::ShflUp: return i - l.arg >= segment ? i - l.arg : -1;
    case WarpOp::ShflDown: return i + l.arg < segment + width ? i + l.arg : -1;
    default: {
      const int src = i ^ l.arg;
      return src < segment + width ? src : -1;
    }
  }
}

// Completes the collective of the lanes of `mask` (all waiting at it) in warp w.
void resolve_group(Lane* w, unsigned mask, uint32_t& warp_counter) {
  const Lane& first = w[__builtin_ctz(mask)];
  const WarpOp op = first.op;
  auto each = [&](auto&& f) {
    for (int i = 0; i < 32; ++i)
      if (mask >> i & 1u) f(i);
  };
  switch (op) {
    case WarpOp::Sync: break;
    case WarpOp::ShflIdx: case WarpOp::ShflUp: case WarpOp::ShflDown: case WarpOp::ShflXor:
      each([&](int i) {
        const int src = shuffle_source(w[i], i);
        if (src >= 0 && !(mask >> src & 1u)) {
          state().current = &w[i];
          fail(std::string(op_name(op)) + ": lane " + std::to_string(i) + " reads lane " +
               std::to_string(src) + ", which is not in the mask");
        }
        w[i].result = src >= 0 ? w[src].value : w[i].value;
      });
      break;
    case WarpOp::Ballot: case WarpOp::Any: case WarpOp::All: {
      uint32_t bits = 0;
      each([&](int i) { bits |= static_cast<uint32_t>(w[i].value != 0) << i; });
      const uint64_t r = op == WarpOp::Ballot ? bits : op == WarpOp::Any ? bits != 0 : bits == mask;
      each([&](int i) { w[i].result = r; });
      break;
    }
    case WarpOp::ReduceMin: case WarpOp::ReduceMax: case WarpOp::ReduceAdd: {
      const bool is_signed = first.arg != 0;
      int64_t acc = 0;
      bool have = false;
      each([&](int i) {
        const int64_t v = is_signed ? static_cast<int64_t>(static_cast<int32_t>(w[i].value))
                                    : static_cast<int64_t>(static_cast<uint32_t>(w[i].value));
        if (!have) acc = v;
        else if (op == WarpOp::ReduceMin) acc = std::min(acc, v);
        else if (op == WarpOp::ReduceMax) acc = std::max(acc, v);
        else acc = static_cast<int64_t>(static_cast<uint32_t>(acc + v));
        have = true;
      });
      each([&](int i) { w[i].result = static_cast<uint64_t>(acc); });
      break;
    }
    case WarpOp::Ldmatrix: case WarpOp::LdmatrixTrans:
      resolve_ldmatrix(w, op == WarpOp::LdmatrixTrans);
      break;
    case WarpOp::Mma:
      resolve_mma(w);
      break;
  }
  ++warp_counter;
  each([&](int i) { w[i].warp_epoch = warp_counter; });
}

// Completes every collective of warp w whose lanes are all there; false if none.
bool resolve_warp(unsigned warp) {
  State& s = state();
  Lane* w = &s.lanes[32 * warp];
  bool progress = false;
  unsigned done = 0;  // lanes whose group was handled
  for (int i = 0; i < 32; ++i) {  // PTX: a lane calling with a mask without itself is undefined
    if (w[i].at != At::Warp || (w[i].mask >> i & 1u)) continue;
    s.current = &w[i];
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x", w[i].mask);
    fail(std::string(op_name(w[i].op)) + " with mask 0x" + hex + " called by lane " +
         std::to_string(i) + ", which is not in it");
    return false;
  }
  for (int i = 0; i < 32 && s.error.empty(); ++i) {
    if (w[i].at != At::Warp || (done >> i & 1u)) continue;
    const unsigned mask = w[i].mask;
    s.current = &w[i];
    const bool full_only = w[i].op == WarpOp::Ldmatrix || w[i].op == WarpOp::LdmatrixTrans ||
                           w[i].op == WarpOp::Mma;
    if (full_only && mask != 0xffffffffu) {
      fail(std::string(op_name(w[i].op)) + " needs all 32 lanes");
      break;
    }
    bool ready = true;
    for (int j = 0; j < 32 && ready; ++j) {
      if (!(mask >> j & 1u)) continue;
      const Lane& o = w[j];
      if (o.at == At::Done) {
        fail(std::string(op_name(w[i].op)) + ": lane " + std::to_string(j) +
             " of the mask has exited");
        return false;
      }
      ready = o.at == At::Warp && o.op == w[i].op && o.mask == mask;
    }
    done |= mask;
    if (!ready) continue;
    resolve_group(w, mask, s.warp_counters[warp]);
    for (int j = 0; j < 32; ++j)
      if (mask >> j & 1u) w[j].at = At::Running;
    progress = true;
  }
  s.current = nullptr;
  return progress;
}

// ---------------------------------------------------------------- float atomics

void apply_float_adds() {
  State& s = state();
  for (const FloatAdd& f : s.float_adds) {
    if (f.is_double) {
      double v = f.initial;
      for (auto it = f.addends.rbegin(); it != f.addends.rend(); ++it) v += *it;
      std::memcpy(f.address, &v, 8);
    } else {
      float v = static_cast<float>(f.initial);
      for (auto it = f.addends.rbegin(); it != f.addends.rend(); ++it) v += static_cast<float>(*it);
      std::memcpy(f.address, &v, 4);
    }
  }
  s.float_adds.clear();
}

template <typename T>
void log_float_add(T* p, T old, T v) {
  State& s = state();
  if (s.schedule != Schedule::Adversarial) return;
  for (FloatAdd& f : s.float_adds) {
    if (f.address == p) {
      f.addends.push_back(v);
      return;
    }
  }
  s.float_adds.push_back({p, sizeof(T) == 8, static_cast<double>(old), {static_cast<double>(v)}});
}

template <typename T, typename F>
T atomic_rmw(T* p, T v, F&& f) {
  State& s = state();
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (s.current != nullptr && s.error.empty() && a - s.smem_begin < s.smem_bytes)
    smem_access(a, sizeof(T), true, true);
  const T old = *p;
  *p = f(old, v);
  return old;
}

// ---------------------------------------------------------------- scheduler

void release(Cta& cta) {
  State& s = state();
  ++cta.epoch;
  apply_float_adds();
  for (Lane& l : s.lanes)
    if (&s.ctas[l.cta] == &cta) l.at = At::Running;
}

// Marks CTA c exited once all its threads are.
void note_exit(unsigned c) {
  State& s = state();
  const unsigned threads = s.block.x;
  for (unsigned t = 0; t < threads; ++t)
    if (s.lanes[c * threads + t].at != At::Done) return;
  s.ctas[c].exited = true;
}

// Runs the CTAs of one cluster to completion (or to the first error).
void run_cluster() {
  State& s = state();
  const unsigned threads = s.block.x;
  const unsigned total = threads * s.cluster;
  const unsigned warps = total / 32;
  while (s.stacks.size() < total) s.stacks.push_back(std::make_unique<Stack>());
  s.lanes.assign(total, Lane{});
  s.warp_counters.assign(warps, 0);
  for (unsigned i = 0; i < total; ++i) {
    Lane& l = s.lanes[i];
    l.index = i;
    l.cta = i / threads;
    l.thread = i % threads;
    start_fiber(l, *s.stacks[i]);
  }
  ++s.cluster_epoch;
  // Runs the lanes of warp w that may run until each blocks, then completes what collectives
  // it can. Returns whether the warp moved.
  auto advance = [&](unsigned w) {
    bool moved = false;
    for (unsigned i = 32 * w; i < 32 * w + 32 && s.error.empty(); ++i) {
      if (s.lanes[i].at != At::Running) continue;
      resume(s.lanes[i]);
      moved = true;
      if (s.lanes[i].at == At::Done) note_exit(s.lanes[i].cta);
    }
    if (!s.error.empty()) return false;
    return resolve_warp(w) || moved;
  };
  for (;;) {
    bool progress = false;
    if (s.schedule == Schedule::Adversarial) {
      for (unsigned w = warps; w-- > 0 && !progress && s.error.empty();) {
        while (s.error.empty() && advance(w)) progress = true;
      }
    } else {
      for (unsigned w = 0; w < warps && s.error.empty(); ++w) progress = advance(w) || progress;
    }
    if (!s.error.empty()) return;
    if (progress) continue;
    bool all_done = true, cluster_ready = true;
    for (const Lane& l : s.lanes) {
      all_done = all_done && l.at == At::Done;
      cluster_ready = cluster_ready && l.at == At::SyncCluster;
    }
    if (all_done) {
      apply_float_adds();
      return;
    }
    if (cluster_ready) {
      ++s.cluster_epoch;
      for (Cta& c : s.ctas) release(c);
      continue;
    }
    for (unsigned c = 0; c < s.cluster; ++c) {
      bool ready = true, any_done = false;
      for (unsigned t = 0; t < threads; ++t) {
        const Lane& l = s.lanes[c * threads + t];
        ready = ready && l.at == At::SyncThreads;
        any_done = any_done || l.at == At::Done;
      }
      if (ready) {
        release(s.ctas[c]);
        progress = true;
      } else if (any_done && !s.ctas[c].exited) {
        for (unsigned t = 0; t < threads; ++t) {
          const Lane& l = s.lanes[c * threads + t];
          if (l.at == At::SyncThreads || l.at == At::SyncCluster) {
            s.current = const_cast<Lane*>(&l);
            fail("threads exited while others wait at a barrier");
            return;
          }
        }
      }
    }
    if (progress) continue;
    // Describe the deadlock by what the first blocked lane of each warp waits at.
    std::string what;
    for (unsigned w = 0; w < warps && what.size() < 300; ++w) {
      for (unsigned i = 32 * w; i < 32 * w + 32; ++i) {
        const Lane& l = s.lanes[i];
        if (l.at == At::Done) continue;
        what += " warp " + std::to_string(w) + ": " +
                (l.at == At::SyncThreads ? "__syncthreads"
                 : l.at == At::SyncCluster ? "cluster barrier"
                                           : op_name(l.op));
        break;
      }
    }
    s.current = nullptr;
    fail("deadlock or divergent collectives; waiting:" + what);
    return;
  }
}

}  // namespace

// ---------------------------------------------------------------- public API

void begin(Schedule schedule) {
  State& s = state();
  s.schedule = schedule;
  s.error.clear();
  s.globals.clear();
  s.guards.clear();
  s.float_adds.clear();
}

void register_global(const void* ptr, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  state().globals.push_back({a, a + bytes});
}

void guard_global(const void* ptr, size_t bytes, const char* name, bool before) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  state().guards.push_back({a, a + bytes, name, before});
}

const std::string& error() { return state().error; }

void launch(Dim3 grid, Dim3 block, size_t dynamic_smem, unsigned cluster,
            const std::function<void()>& body) {
  State& s = state();
  if (!s.error.empty()) return;
  if (block.x % 32 != 0 || block.x > 1024 || block.y != 1 || block.z != 1)
    throw std::runtime_error("emulator: blockDim must be (32k, 1, 1) with 32k <= 1024");
  if (cluster == 0 || cluster > 8 || grid.x % cluster != 0)
    throw std::runtime_error("emulator: the cluster size must divide gridDim.x and be 1 to 8");
  s.grid = grid;
  s.block = block;
  s.cluster = cluster;
  s.body = &body;
  s.dynamic_bytes = dynamic_smem;
  s.cta_bytes = kStaticCapacity + ((dynamic_smem + 127) & ~size_t{127}) + kRedZone;
  s.static_sites.clear();
  s.static_used = 0;
  s.smem.resize(s.cta_bytes * cluster + 16);
  const auto raw = reinterpret_cast<uintptr_t>(s.smem.data());
  s.smem_begin = (raw + 15) & ~uintptr_t{15};
  s.smem_bytes = s.cta_bytes * cluster;
  if (s.shadow.size() < s.smem_bytes / 4) s.shadow.resize(s.smem_bytes / 4);
  s.ctas.assign(cluster, Cta{});
  const unsigned clusters_x = grid.x / cluster;
  const unsigned clusters = clusters_x * grid.y;
  for (unsigned n = 0; n < clusters && s.error.empty(); ++n) {
    const unsigned k = s.schedule == Schedule::Adversarial ? clusters - 1 - n : n;
    for (unsigned r = 0; r < cluster; ++r) {
      Cta& c = s.ctas[r];
      c = Cta{};
      c.block_idx = Dim3{(k % clusters_x) * cluster + r, k / clusters_x, 0};
      c.smem = reinterpret_cast<unsigned char*>(s.smem_begin + r * s.cta_bytes);
    }
    // Poisoned so that reads of shared memory nothing wrote show up as wrong results.
    std::memset(reinterpret_cast<void*>(s.smem_begin), 0xff, s.smem_bytes);
    run_cluster();
  }
  apply_float_adds();
  s.lanes.clear();
  s.current = nullptr;
  s.body = nullptr;
  s.smem_bytes = 0;
}

void fail(const std::string& message) {
  State& s = state();
  if (s.error.empty()) s.error = message + where(s.current);
  // A faulting lane stops where it is (it could loop forever on what it read): the scheduler
  // resumes nothing once there is an error.
  if (s.on_fiber) switch_to_scheduler(*s.current);
}

Dim3 thread_idx() { return Dim3{state().current->thread, 0, 0}; }
Dim3 block_idx() {
  State& s = state();
  return s.ctas[s.current->cta].block_idx;
}
Dim3 block_dim() { return state().block; }
Dim3 grid_dim() { return state().grid; }
unsigned cluster_rank() { return state().current->cta; }
unsigned cluster_size() { return state().cluster; }

unsigned char* dynamic_smem() {
  State& s = state();
  return s.ctas[s.current->cta].smem + kStaticCapacity;
}

void* static_smem(const void* site, size_t bytes, size_t align) {
  State& s = state();
  auto it = s.static_sites.find(site);
  if (it == s.static_sites.end()) {
    const size_t offset = (s.static_used + align - 1) & ~(align - 1);
    if (offset + bytes > kStaticCapacity) {
      fail("static shared memory above 48 KiB");
      return s.ctas[s.current->cta].smem;
    }
    it = s.static_sites.emplace(site, offset).first;
    s.static_used = offset + bytes;
  }
  return s.ctas[s.current->cta].smem + it->second;
}

void sync_threads() { block_at(At::SyncThreads); }
void sync_cluster() { block_at(At::SyncCluster); }

void* map_shared_rank(const void* local, unsigned rank) {
  State& s = state();
  const auto a = reinterpret_cast<uintptr_t>(local);
  const uintptr_t own = reinterpret_cast<uintptr_t>(s.ctas[s.current->cta].smem);
  if (a < own || a >= own + s.cta_bytes) {
    fail("map_shared_rank of an address outside this block's shared memory");
    return const_cast<void*>(local);
  }
  if (rank >= s.cluster) {
    fail("map_shared_rank to block rank " + std::to_string(rank) + " of a cluster of " +
         std::to_string(s.cluster));
    return const_cast<void*>(local);
  }
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(s.ctas[rank].smem) + (a - own));
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  State& s = state();
  Lane& l = *s.current;
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) fail("shuffle width must be a power of two up to 32");
  l.op = op;
  l.mask = mask;
  l.value = value;
  l.arg = arg;
  l.width = width;
  block_at(At::Warp);
  return l.result;
}

void cp_async_16(void* smem, const void* gmem, bool valid) {
  State& s = state();
  if (!aligned16(smem) || !in_smem(smem, 16)) fail("cp.async: bad shared destination");
  if (valid && (!aligned16(gmem) || !in_globals(gmem, 16)))
    fail("cp.async: source outside the registered global buffers or not 16-byte aligned");
  if (!s.error.empty()) return;
  Lane& l = *s.current;
  PendingCopy c{static_cast<unsigned char*>(smem),
                valid ? static_cast<const unsigned char*>(gmem) : nullptr, l.committed};
  if (s.schedule == Schedule::Adversarial) {
    land(c);
  } else {
    l.copies.push_back(c);
  }
}

void cp_async_commit() { ++state().current->committed; }

void cp_async_wait(int pending_groups) {
  Lane& l = *state().current;
  // Groups with index < committed - pending_groups are complete.
  const int complete_below = l.committed - pending_groups;
  std::vector<PendingCopy> rest;
  for (const PendingCopy& c : l.copies) {
    if (c.group < complete_below) {
      land(c);
    } else {
      rest.push_back(c);
    }
  }
  l.copies.swap(rest);
}

void ldmatrix_x4(uint32_t (&r)[4], const void* smem, bool trans) {
  State& s = state();
  if (!aligned16(smem) || !in_smem(smem, 16)) fail("ldmatrix: bad shared row address");
  Lane& l = *s.current;
  l.address = smem;
  warp_collective(trans ? WarpOp::LdmatrixTrans : WarpOp::Ldmatrix, 0xffffffffu, 0, 0, 32);
  for (int i = 0; i < 4; ++i) r[i] = l.out[i];
}

void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool half) {
  Lane& l = *state().current;
  for (int i = 0; i < 4; ++i) {
    l.a[i] = a[i];
    l.c[i] = d[i];
  }
  l.b0 = b0;
  l.b1 = b1;
  l.half = half;
  warp_collective(WarpOp::Mma, 0xffffffffu, 0, 0, 32);
  for (int i = 0; i < 4; ++i) std::memcpy(&d[i], &l.out[i], 4);
}

uint32_t atomic_add(uint32_t* p, uint32_t v) { return atomic_rmw(p, v, [](uint32_t a, uint32_t b) { return a + b; }); }
int32_t atomic_add(int32_t* p, int32_t v) {
  return atomic_rmw(p, v, [](int32_t a, int32_t b) { return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b)); });
}
unsigned long long atomic_add(unsigned long long* p, unsigned long long v) {
  return atomic_rmw(p, v, [](unsigned long long a, unsigned long long b) { return a + b; });
}
float atomic_add(float* p, float v) {
  const float old = atomic_rmw(p, v, [](float a, float b) { return a + b; });
  log_float_add(p, old, v);
  return old;
}
double atomic_add(double* p, double v) {
  const double old = atomic_rmw(p, v, [](double a, double b) { return a + b; });
  log_float_add(p, old, v);
  return old;
}
uint32_t atomic_min(uint32_t* p, uint32_t v) { return atomic_rmw(p, v, [](uint32_t a, uint32_t b) { return std::min(a, b); }); }
int32_t atomic_min(int32_t* p, int32_t v) { return atomic_rmw(p, v, [](int32_t a, int32_t b) { return std::min(a, b); }); }
unsigned long long atomic_min(unsigned long long* p, unsigned long long v) {
  return atomic_rmw(p, v, [](unsigned long long a, unsigned long long b) { return std::min(a, b); });
}
uint32_t atomic_max(uint32_t* p, uint32_t v) { return atomic_rmw(p, v, [](uint32_t a, uint32_t b) { return std::max(a, b); }); }
int32_t atomic_max(int32_t* p, int32_t v) { return atomic_rmw(p, v, [](int32_t a, int32_t b) { return std::max(a, b); }); }
unsigned long long atomic_max(unsigned long long* p, unsigned long long v) {
  return atomic_rmw(p, v, [](unsigned long long a, unsigned long long b) { return std::max(a, b); });
}

}  // namespace specdec::emu

// ---------------------------------------------------------------- -fsanitize=thread hooks
//
// The kernels' translation units are compiled with -fsanitize=thread: the compiler calls these
// before every load and store (after optimisation: values kept in registers are not memory).

extern "C" {
using specdec::emu::check_access;
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_read1(void* p) { check_access(p, 1, false); }
void __tsan_read2(void* p) { check_access(p, 2, false); }
void __tsan_read4(void* p) { check_access(p, 4, false); }
void __tsan_read8(void* p) { check_access(p, 8, false); }
void __tsan_read16(void* p) { check_access(p, 16, false); }
void __tsan_write1(void* p) { check_access(p, 1, true); }
void __tsan_write2(void* p) { check_access(p, 2, true); }
void __tsan_write4(void* p) { check_access(p, 4, true); }
void __tsan_write8(void* p) { check_access(p, 8, true); }
void __tsan_write16(void* p) { check_access(p, 16, true); }
void __tsan_unaligned_read2(void* p) { check_access(p, 2, false); }
void __tsan_unaligned_read4(void* p) { check_access(p, 4, false); }
void __tsan_unaligned_read8(void* p) { check_access(p, 8, false); }
void __tsan_unaligned_read16(void* p) { check_access(p, 16, false); }
void __tsan_unaligned_write2(void* p) { check_access(p, 2, true); }
void __tsan_unaligned_write4(void* p) { check_access(p, 4, true); }
void __tsan_unaligned_write8(void* p) { check_access(p, 8, true); }
void __tsan_unaligned_write16(void* p) { check_access(p, 16, true); }
void __tsan_read_range(void* p, unsigned long n) { check_access(p, n, false); }
void __tsan_write_range(void* p, unsigned long n) { check_access(p, n, true); }
void __tsan_volatile_read1(void* p) { check_access(p, 1, false); }
void __tsan_volatile_read2(void* p) { check_access(p, 2, false); }
void __tsan_volatile_read4(void* p) { check_access(p, 4, false); }
void __tsan_volatile_read8(void* p) { check_access(p, 8, false); }
void __tsan_volatile_read16(void* p) { check_access(p, 16, false); }
void __tsan_volatile_write1(void* p) { check_access(p, 1, true); }
void __tsan_volatile_write2(void* p) { check_access(p, 2, true); }
void __tsan_volatile_write4(void* p) { check_access(p, 4, true); }
void __tsan_volatile_write8(void* p) { check_access(p, 8, true); }
void __tsan_volatile_write16(void* p) { check_access(p, 16, true); }
void __tsan_vptr_read(void**) {}
void __tsan_vptr_update(void**, void*) {}
}

// ---------------------------------------------------------------- C interface
//
// What python_tests/emulation.py calls around a kernel family's entry point: begin a call,
// guard and register its buffers, read its error.

extern "C" {

int specdec_emu_begin(int adversarial) {
  specdec::emu::begin(adversarial ? specdec::emu::Schedule::Adversarial
                                  : specdec::emu::Schedule::Lockstep);
  return 0;
}

int specdec_emu_guard(const void* ptr, long bytes, const char* name, int before) {
  specdec::emu::guard_global(ptr, static_cast<size_t>(bytes), name, before != 0);
  return 0;
}

int specdec_emu_register(const void* ptr, long bytes) {
  specdec::emu::register_global(ptr, static_cast<size_t>(bytes));
  return 0;
}

// Copies the error of the call (empty: none) into `text`; returns whether there was one.
int specdec_emu_error(char* text, int length) {
  const std::string& message = specdec::emu::error();
  std::snprintf(text, static_cast<size_t>(length), "%s", message.c_str());
  return message.empty() ? 0 : 1;
}

}  // extern "C"
