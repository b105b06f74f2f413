// Row teams of the sampling and verification kernels: the blocks that process one row of logits
// together, their shared memory and their collective operations. No torch includes.
//
// A row team processes one row of logits (a node's target row, or a row of ops.sample): a
// thread-block cluster of S blocks (S = 1..8, chosen by the launcher: plan_team; S = 1 before
// sm_90), each block owning a contiguous slice of the row, each warp a contiguous segment of its
// block's slice. Results that span the row (max, sums, histograms, the drawn token) are combined
// in a fixed order (lane butterflies, then warps, then blocks by rank through distributed shared
// memory), so every block holds the same value and a run is deterministic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/sampling.h"
#include "cuda/kernels/device_code.cuh"

namespace specdec {

constexpr int kTeamThreads = 256;  // threads per block
constexpr int kTeamWarps = kTeamThreads / 32;
constexpr int kMaxTeamBlocks = 8;  // blocks per team (portable cluster size)
constexpr int kMaxSegments = kMaxTeamBlocks * kTeamWarps;
constexpr int kListCap = 512;      // kept tokens a list holds
constexpr int64_t kPreselect = kListCap / 2;  // top-p without top-k: tokens preselected
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kColumnWords = (kRadixBins / 2) * 32;  // packed 16-bit counts [bin / 2][lane]
constexpr uint32_t kWorkBytes = kColumnWords * 4;      // 16 KiB

// ----------------------------------------------------------------------------- layout

// What the launcher decides per launch (see row_teams.cuh).
struct TeamArgs {
  int size;              // blocks per team: the cluster size
  uint32_t cache_bytes;  // shared memory per block for its slice of the row; 0: no copy
  bool table;            // bf16 rows long enough to repay building the weight table
};

SPECDEC_HD uint32_t align16(uint32_t x) { return (x + 15u) & ~15u; }

// Dynamic shared memory of a block (byte offsets), the same on host and device.
struct TeamLayout {
  uint32_t table;        // float [2 * kWeightTableSpan] (bf16 logits only; core/sampling.h)
  uint32_t work;         // kWorkBytes: histogram columns, or the fixed-point histogram
  uint32_t list_index;   // int32 [kListCap]: kept token ids, in index order
  uint32_t list_key;     // uint32 [kListCap]: their keys (float_key of the logit)
  uint32_t list_weight;  // float [kListCap]: their weights w(x)
  uint32_t sort;         // uint64 [kListCap]: the gathered list, then the list sorted for top-p
  uint32_t cache;        // the block's slice of the row, raw element bits
  uint32_t bytes;        // total
};

SPECDEC_HD TeamLayout team_layout(bool with_table, uint32_t cache_bytes) {
  TeamLayout l{};
  uint32_t o = 0;
  l.table = o;
  o += with_table ? 2u * kWeightTableSpan * 4u : 0u;
  l.work = o;
  o += kWorkBytes;
  l.list_index = o;
  o += kListCap * 4u;
  l.list_key = o;
  o += kListCap * 4u;
  l.list_weight = o;
  o += kListCap * 4u;
  l.sort = o;
  o += kListCap * 8u;
  l.cache = o;
  o += align16(cache_bytes);
  l.bytes = o;
  return l;
}

// Values a block publishes to its team; double-buffered (see Team::publish).
struct TeamExchange {
  double seg[kTeamWarps];  // one per warp (segment sums)
  float f;
  int flag;
  int64_t i;
  int64_t n;
};

// Static shared memory of a block. Trivial members only (no __shared__ initialisers).
struct TeamShared {
  TeamExchange ex[2];
  uint32_t counts[2][kRadixBins];  // the block's radix counts, for the exchange
  uint32_t counts_total[kRadixBins];
  double seg_kept[kMaxSegments];  // per-segment sums of the kept weights (draws)
  double seg_tmp[kMaxSegments];   // per-segment sums of a residual function
  double warp_d[kTeamWarps];
  float warp_f[kTeamWarps];
  int64_t warp_i[kTeamWarps];
  int warp_n[kTeamWarps];
  int list_fill;
};

// ----------------------------------------------------------------------------- launch plan

// What the team plan needs to know about a device (cudaDeviceGetAttribute).
struct DeviceLimits {
  int sms = 0;
  int major = 0;           // compute capability
  int smem_per_sm = 0;     // bytes
  int smem_per_block = 0;  // bytes a block may opt in to
};

// The team of each row: on sm_90 and later a cluster of up to 8 blocks, enough that a block's
// slice of the row fits its shared memory with two blocks per SM (more when there are few rows,
// so that about two blocks per SM are busy, keeping at least 4096 elements per block). Earlier
// GPUs: one block per row. The slice is copied to shared memory when it fits (two blocks per
// SM, else one); else later passes re-read global memory. `elem_bytes`: bytes per logit, `vec`:
// logits per load (team_vector_width), `bf16`: whether the logits are bfloat16.
inline TeamArgs plan_team(int64_t rows, int64_t vocab, int64_t elem_bytes, int vec, bool bf16,
                          const DeviceLimits& info, uint32_t& smem_bytes) {
  const int64_t tile = 32 * vec;
  const int64_t tiles = ceil_div<int64_t>(vocab, tile);
  // Building the bf16 weight table (4096 exps) pays off once a row is a few times longer.
  const bool table = bf16 && vocab >= kWeightTableMinVocab;
  const int64_t fixed = team_layout(table, 0).bytes;
  const int64_t reserved = static_cast<int64_t>(sizeof(TeamShared)) + 64 + 1024;  // + per-block reserve
  const auto budget = [&](int blocks_per_sm) {
    return std::min<int64_t>(info.smem_per_block, info.smem_per_sm / blocks_per_sm) - reserved -
           fixed;
  };
  const auto slice_bytes = [&](int size) {
    return ceil_div<int64_t>(tiles, size) * tile * elem_bytes;
  };
  int size = 1;
  if (info.major >= 9) {
    while (size < kMaxTeamBlocks && slice_bytes(size) > budget(2)) size *= 2;
    while (size < kMaxTeamBlocks && rows * size < 2 * info.sms &&
           ceil_div<int64_t>(tiles, 2 * size) * tile >= 4096)
      size *= 2;
  }
  int64_t cache = slice_bytes(size);
  if (cache > budget(1)) cache = 0;
  smem_bytes = team_layout(table, static_cast<uint32_t>(cache)).bytes;
  return {size, static_cast<uint32_t>(cache), table};
}

// Logits per load: 16 bytes when every row of `row_bytes` bytes starting at `base` is 16-byte
// aligned, else one element at a time.
inline int team_vector_width(int64_t row_bytes, const void* base, int elem_bytes) {
  const bool aligned = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  return aligned ? 16 / elem_bytes : 1;
}

// Calls launch(T{}, integral_constant<int, VEC>{}) for the vector width `vec`.
template <typename T, typename Launch>
void dispatch_team_width(int vec, const Launch& launch) {
  if (vec == 1) {
    launch(T{}, std::integral_constant<int, 1>{});
  } else {
    launch(T{}, std::integral_constant<int, 16 / static_cast<int>(sizeof(T))>{});
  }
}

#if defined(SPECDEC_DEVICE_CODE)

// ----------------------------------------------------------------------------- warp sums

// Every lane gets the same value: the butterfly adds commute lane by lane.
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Inclusive prefix sum over the lanes (lane order).
__device__ __forceinline__ double warp_scan_d(double v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// ----------------------------------------------------------------------------- team

// The blocks of one row team. Every thread of every block calls the methods in the same order
// with the same arguments.
struct Team {
  int size;   // blocks (cluster size)
  int rank;   // this block's rank in the cluster
  int phase;  // which exchange buffer the next publish fills
  TeamShared& sh;

  // A barrier over every thread of the team, ordering shared and global memory.
  __device__ __forceinline__ void sync() const {
#if defined(SPECDEC_CLUSTERS)
    if (size > 1) {
      cooperative_groups::this_cluster().sync();
      return;
    }
#endif
    __syncthreads();
  }

  // `local` (an address in this block's shared memory) in block `r` of the team.
  template <typename P>
  __device__ __forceinline__ P* at(P* local, int r) const {
#if defined(SPECDEC_CLUSTERS)
    if (size > 1) return cooperative_groups::this_cluster().map_shared_rank(local, r);
#endif
    return local;
  }

  __device__ __forceinline__ TeamExchange& mine() { return sh.ex[phase]; }

  // Makes what every block wrote to mine() (and counts[phase]) visible to the team and returns
  // the buffer to read with of(). A block writes buffer k % 2 for exchange k only after the
  // barrier of exchange k - 1, which every block reaches only after reading exchange k - 2:
  // two buffers and one barrier per exchange suffice.
  __device__ __forceinline__ int publish() {
    sync();
    const int p = phase;
    phase ^= 1;
    return p;
  }
  __device__ __forceinline__ const TeamExchange& of(int r, int p) const {
    return *at(&sh.ex[p], r);
  }
  __device__ __forceinline__ bool leader() const { return rank == 0 && threadIdx.x == 0; }
};

// Sum over the block; every thread gets the same value (warps in order).
SPECDEC_DEVICE_FUNCTION double block_sum_d(double v, TeamShared& sh) {
  v = warp_sum_d(v);
  if ((threadIdx.x & 31) == 0) sh.warp_d[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0.0;
#pragma unroll
  for (int w = 0; w < kTeamWarps; ++w) total += sh.warp_d[w];
  __syncthreads();
  return total;
}

// Inclusive prefix sum over the block in thread order; `total` receives the block's sum.
SPECDEC_DEVICE_FUNCTION double block_scan_d(double v, double& total, TeamShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const double inclusive = warp_scan_d(v, lane);
  if (lane == 31) sh.warp_d[warp] = inclusive;
  __syncthreads();
  double before = 0.0;
  total = 0.0;
#pragma unroll
  for (int w = 0; w < kTeamWarps; ++w) {
    if (w == warp) before = total;
    total += sh.warp_d[w];
  }
  __syncthreads();
  return before + inclusive;
}

SPECDEC_DEVICE_FUNCTION int block_min_i(int v, TeamShared& sh) {
  v = __reduce_min_sync(kFullMask, v);
  if ((threadIdx.x & 31) == 0) sh.warp_n[threadIdx.x >> 5] = v;
  __syncthreads();
  int m = sh.warp_n[0];
#pragma unroll
  for (int w = 1; w < kTeamWarps; ++w) m = sh.warp_n[w] < m ? sh.warp_n[w] : m;
  __syncthreads();
  return m;
}

SPECDEC_DEVICE_FUNCTION int block_max_i(int v, TeamShared& sh) {
  v = __reduce_max_sync(kFullMask, v);
  if ((threadIdx.x & 31) == 0) sh.warp_n[threadIdx.x >> 5] = v;
  __syncthreads();
  int m = sh.warp_n[0];
#pragma unroll
  for (int w = 1; w < kTeamWarps; ++w) m = sh.warp_n[w] > m ? sh.warp_n[w] : m;
  __syncthreads();
  return m;
}

// Sorts keys[0, n) ascending in place (n a power of two, at most kListCap): bitonic network.
SPECDEC_DEVICE_FUNCTION void block_sort_u64(unsigned long long* keys, int n) {
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += kTeamThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const unsigned long long a = keys[i], b = keys[partner];
          const bool ascending = (i & k) == 0;
          if (ascending ? a > b : a < b) {
            keys[i] = b;
            keys[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

#endif  // SPECDEC_DEVICE_CODE

}  // namespace specdec
