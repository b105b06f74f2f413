// One row of logits processed by a row team (team.cuh): the Row of core/verify.h on the GPU.
// No torch includes.
//
// Passes over a row (V elements):
//   pass 1     every row, from global memory: NaN/+Inf check, max and argmax (16-byte loads,
//              8 in flight per thread); sampling rows also copy their slice into shared memory
//              (the launcher sizes S so that it fits) and every later pass reads that copy.
//   greedy rows stop here.
//   sums       sampling rows: the weights w(x) (bf16 logits, V >= 16384: a 4096-entry table
//              of exp per row, built once, bit-identical to computing them), summed with an
//              error-free float transformation per thread (TwoSum) and in double across
//              threads and segments; the per-segment sums are kept so that a draw scans one
//              segment.
//   top-k      count-only radix rounds (8-bit digits, per-lane histogram columns: no bank
//              conflicts, integer sums, no weights); the kept tokens (k plus ties) are then
//              gathered into a list held by every block, on which top-p (sort + cumsum),
//              min-p, the kept mass and the draws work: no further pass over the row.
//   top-p      with top-k: on the list. Without top-k: the top 256 tokens are preselected the
//              same way and used when they hold the nucleus; otherwise (a wide nucleus) radix
//              rounds with exact fixed-point masses (integer atomics: order-independent).
//   draws      inverse CDF: the segment (or list entry) where the cumulative weight crosses the
//              target, then one warp scans that segment only.
// Rejected children with draft probabilities need their residual sums: full passes over the
// cached row (rare: only at a rejection with draft_probs). Nothing of size [B, K+1, V] is
// written.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/sampling.h"
#include "cuda/kernels/device_code.cuh"
#include "cuda/kernels/team.cuh"

#if defined(SPECDEC_DEVICE_CODE)

namespace specdec {

// The fixed-point radix histogram in the work area: counts, then the high and low 32-bit
// halves of floor(w * 2^64) summed per bin (exact integers: the order of the adds is free).
struct FixedHistogram {
  uint32_t count[kRadixBins];
  unsigned long long hi[kRadixBins];
  unsigned long long lo[kRadixBins];
  double mass[kRadixBins];  // the team's masses, filled after the exchange
};
static_assert(sizeof(FixedHistogram) <= kWorkBytes, "work area too small");

// ----------------------------------------------------------------------------- elements

// Logits are handled as raw bits (the row copy in shared memory keeps them so).
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using Bits = uint32_t;
  static constexpr Bits kNegInf = 0xFF800000u;
  static constexpr bool kTable = false;
  __device__ static float value(Bits b) { return __uint_as_float(b); }
  __device__ static Bits bits(float v) { return __float_as_uint(v); }
};
template <>
struct Elem<__half> {
  using Bits = uint16_t;
  static constexpr Bits kNegInf = 0xFC00u;
  static constexpr bool kTable = false;
  __device__ static float value(Bits b) { return __half2float(__ushort_as_half(b)); }
  __device__ static Bits bits(float v) { return __half_as_ushort(__float2half_rn(v)); }  // exact
};
template <>
struct Elem<__nv_bfloat16> {
  using Bits = uint16_t;
  static constexpr Bits kNegInf = 0xFF80u;
  static constexpr bool kTable = true;
  __device__ static float value(Bits b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
  __device__ static Bits bits(float v) { return static_cast<Bits>(__float_as_uint(v) >> 16); }
};

// VEC raw elements as loaded: a 16-byte vector kept as four words (an element is extracted
// where it is used, so eight loads in flight cost 32 registers), or a single element.
template <typename B, int VEC>
struct RawVec {
  static_assert(VEC * sizeof(B) == 16, "a vector is 16 bytes or one element");
  uint4 v;
  __device__ __forceinline__ B get(int i) const {
    const uint32_t w = (i >> (sizeof(B) == 2 ? 1 : 0)) == 0   ? v.x
                       : (i >> (sizeof(B) == 2 ? 1 : 0)) == 1 ? v.y
                       : (i >> (sizeof(B) == 2 ? 1 : 0)) == 2 ? v.z
                                                              : v.w;
    if constexpr (sizeof(B) == 2) {
      return static_cast<B>(w >> ((i & 1) * 16));
    } else {
      return w;
    }
  }
  __device__ __forceinline__ void load_global(const B* p) {
    v = __ldg(reinterpret_cast<const uint4*>(p));
  }
  __device__ __forceinline__ void load_shared(const B* p) { v = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void store_shared(B* p) const { *reinterpret_cast<uint4*>(p) = v; }
  // The elements of a vector cut by the end of the row (the rest filled with `fill`).
  __device__ __forceinline__ void load_tail(const B* p, int64_t n, B fill) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (sizeof(B) == 2) {
        const uint32_t lo = 2 * k < n ? __ldg(p + 2 * k) : fill;
        const uint32_t hi = 2 * k + 1 < n ? __ldg(p + 2 * k + 1) : fill;
        w[k] = lo | (hi << 16);
      } else {
        w[k] = k < n ? __ldg(p + k) : fill;
      }
    }
    v = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

template <typename B>
struct RawVec<B, 1> {
  B v;
  __device__ __forceinline__ B get(int) const { return v; }
  __device__ __forceinline__ void load_global(const B* p) { v = __ldg(p); }
  __device__ __forceinline__ void load_shared(const B* p) { v = *p; }
  __device__ __forceinline__ void store_shared(B* p) const { *p = v; }
  __device__ __forceinline__ void load_tail(const B* p, int64_t n, B fill) {
    v = n > 0 ? __ldg(p) : fill;
  }
};

// ----------------------------------------------------------------------------- sums

// Error-free float accumulation (Knuth's TwoSum): s + c carries the running sum to about 2^-48
// relative, so a thread adds in float and only the per-warp combination is in double.
struct TwoSum {
  float s = 0.0f, c = 0.0f;
  __device__ __forceinline__ void add(float w) {
    const float t = __fadd_rn(s, w);
    const float bp = __fsub_rn(t, s);
    const float err = __fadd_rn(__fsub_rn(s, __fsub_rn(t, bp)), __fsub_rn(w, bp));
    c = __fadd_rn(c, err);
    s = t;
  }
  __device__ __forceinline__ double value() const {
    return static_cast<double>(s) + static_cast<double>(c);
  }
};

// floor(w * 2^64) for a weight in [0, 2), as its high (w * 2^32) and low 32-bit parts.
__device__ __forceinline__ void fixed_point(float w, unsigned long long& hi, unsigned& lo) {
  const uint32_t b = __float_as_uint(w);
  const int e = static_cast<int>((b >> 23) & 0xFFu);
  if (e == 0) {  // 0 (weights are never subnormal: specdec_exp returns 0 below -87)
    hi = 0;
    lo = 0;
    return;
  }
  const unsigned long long m = (b & 0x7FFFFFu) | 0x800000u;  // w = m * 2^(e - 150)
  const int sh_hi = e - 118;
  hi = sh_hi >= 0 ? (m << sh_hi) : (sh_hi > -64 ? (m >> -sh_hi) : 0ull);
  const int sh_lo = e - 86;
  lo = sh_lo >= 32  ? 0u
       : sh_lo >= 0 ? static_cast<unsigned>(m << sh_lo)
       : sh_lo > -64 ? static_cast<unsigned>(m >> -sh_lo)
                     : 0u;
}

// Zero masses for the count-only radix rounds (the shared pick functions read a mass per bin;
// the bin they pick depends on the counts only).
__constant__ double kZeroMasses[kRadixBins];

// The logit whose float_key is `key` (+0 for the key both zeros share).
__device__ __forceinline__ float key_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// ----------------------------------------------------------------------------- row

// One row processed by a team: the Row of core/verify.h on the GPU. Every method is called
// by all threads of the team with the same arguments and returns the same value in every thread.
template <typename T, int VEC>
struct TeamRow {
  using E = Elem<T>;
  using Bits = typename E::Bits;
  using Vec = RawVec<Bits, VEC>;
  static constexpr int kTile = 32 * VEC;  // elements one warp covers with one load per lane

  const Bits* row;  // global memory
  int64_t vocab;
  int mantissa_bits;
  mutable Team team;   // a copy: its exchange phase advances with this row's exchanges
  unsigned char* dyn;  // dynamic shared memory
  TeamLayout lay;
  bool can_cache;      // the launcher gave this block room for its slice
  bool table_allowed;  // the launcher gave this block room for the weight table
  int64_t tiles;       // ceil(V / kTile)
  int segments;        // team.size * kTeamWarps
  int64_t tile0;       // first tile of this block's slice

  const float* draft_probs = nullptr;  // the request's draft rows
  int64_t draft_row_shift = 0;

  bool greedy = true;
  bool cached = false;   // the slice copy in shared memory is valid
  bool use_table = false;
  int list_size = -1;    // >= 0: the kept tokens are the list (index order)
  int64_t arg = 0;
  RowFilter filter;
  float weighted_log_sum = 0.0f;

  __device__ TeamRow(const T* logits, int64_t v, int mantissa, const Team& t, unsigned char* d,
                     const TeamArgs& args)
      : row(reinterpret_cast<const Bits*>(logits)),
        vocab(v),
        mantissa_bits(mantissa),
        team(t),
        dyn(d),
        lay(team_layout(E::kTable && args.table, args.cache_bytes)),
        can_cache(args.cache_bytes > 0),
        table_allowed(E::kTable && args.table) {
    tiles = (vocab + kTile - 1) / kTile;
    segments = team.size * kTeamWarps;
    tile0 = seg_begin(team.rank * kTeamWarps);
  }

  // ---- geometry
  __device__ int64_t seg_begin(int g) const { return tiles * g / segments; }
  __device__ int my_segment() const {
    return team.rank * kTeamWarps + static_cast<int>(threadIdx.x >> 5);
  }
  __device__ Bits* cache() const { return reinterpret_cast<Bits*>(dyn + lay.cache); }
  __device__ float* table() const { return reinterpret_cast<float*>(dyn + lay.table); }
  __device__ int* list_index() const { return reinterpret_cast<int*>(dyn + lay.list_index); }
  __device__ uint32_t* list_key() const { return reinterpret_cast<uint32_t*>(dyn + lay.list_key); }
  __device__ float* list_weight() const { return reinterpret_cast<float*>(dyn + lay.list_weight); }

  __device__ __forceinline__ void load_row(int64_t x0, Vec& e) const {
    if (x0 + VEC <= vocab) {
      e.load_global(row + x0);
    } else {
      e.load_tail(row + x0, vocab - x0, E::kNegInf);
    }
  }

  // f(x0, e) for every vector of this lane in segment g, in increasing order. The segment must
  // be this block's when read from the cache. From global memory, U loads are issued before any
  // is used (pass 1: the one pass that streams from HBM).
  template <int U, typename F>
  __device__ void visit(int g, bool from_cache, const F& f) const {
    const int lane = threadIdx.x & 31;
    const int64_t t1 = seg_begin(g + 1);
    int64_t t = seg_begin(g);
    if (from_cache) {
      const Bits* c = cache() + lane * VEC;
      for (; t < t1; ++t) {
        Vec e;
        e.load_shared(c + (t - tile0) * kTile);
        f(t * kTile + lane * VEC, e);
      }
      return;
    }
    if constexpr (U > 1) {
      // Groups of U tiles wholly inside the row: plain 16-byte loads (the tail goes below).
      for (; t + U <= t1 && (t + U) * kTile <= vocab; t += U) {
        Vec e[U];
#pragma unroll
        for (int u = 0; u < U; ++u) e[u].load_global(row + (t + u) * kTile + lane * VEC);
#pragma unroll
        for (int u = 0; u < U; ++u) f((t + u) * kTile + lane * VEC, e[u]);
      }
    }
    for (; t < t1; ++t) {
      Vec e;
      load_row(t * kTile + lane * VEC, e);
      f(t * kTile + lane * VEC, e);
    }
  }

  // g(i) for the elements of the vector at x0 inside the row; unrolled in the hot passes only
  // (code size: ptxas time grows with every inlined copy), where whole vectors (all but the
  // row's last) skip the bound checks.
  template <bool kUnroll, typename G>
  __device__ __forceinline__ void each(int64_t x0, const G& g) const {
    const int64_t n = vocab - x0;
    if constexpr (kUnroll) {
      if (n >= VEC) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) g(i);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          if (i < n) g(i);
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < VEC; ++i)
        if (i < n) g(i);
    }
  }

  // ---- weights
  __device__ __forceinline__ float weight_of(Bits b, float l) const {
    if constexpr (E::kTable) {
      if (use_table) {
        const int k = weight_table_index(static_cast<uint32_t>(b));
        if (k >= 0) return table()[k];
      }
    }
    return filter.raw_weight(l);
  }
  // The bf16 weight table, built when a pass over the whole row is about to need the weights
  // (rows whose top-k list holds everything never do): each block of the team computes its
  // share of the entries and copies the others'.
  __device__ void ensure_table() {
    if (!table_allowed || use_table) return;
    float* t = table();
    const int share = 2 * kWeightTableSpan / team.size;
    const int begin = team.rank * share;
    for (int k = begin + static_cast<int>(threadIdx.x); k < begin + share; k += kTeamThreads) {
      t[k] = filter.raw_weight(E::value(static_cast<Bits>(weight_table_bits(k))));
    }
    team.sync();
    if (team.size > 1) {
      for (int k = threadIdx.x; k < 2 * kWeightTableSpan; k += kTeamThreads) {
        const int owner = k / share;
        if (owner != team.rank) t[k] = team.at(t, owner)[k];
      }
      __syncthreads();
    }
    use_table = true;  // tables are never written again: no read-done barrier needed
  }
  __device__ __forceinline__ bool filters_active() const {
    return filter.min_key != 0 || filter.min_weight > 0.0f;
  }
  __device__ __forceinline__ float prob_of(int64_t x, float l) const {
    if (greedy) return x == arg ? 1.0f : 0.0f;
    return filter.prob(l);
  }

  // ---- pass 1: validity, argmax, the slice copy

  // False when the row has NaN/+Inf or no finite value.
  __device__ bool pass_max(bool store) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float best = -INFINITY;
    int best_at = INT32_MAX;  // V < 2^31
    bool bad = false;
    Bits* c = cache();
    visit<8>(my_segment(), false, [&](int64_t x0, const Vec& e) {
      if (store) e.store_shared(c + (x0 - tile0 * kTile));
      // No bound checks: the fill past the row's end (-inf) is neither bad nor a maximum.
      const int at = static_cast<int>(x0);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float v = E::value(e.get(i));
        bad = bad | is_nan_or_pos_inf(v);
        best_at = v > best ? at + i : best_at;  // strict: a lane sees its elements in order
        best = fmaxf(best, v);
      }
    });
    int64_t best_index = best_at == INT32_MAX ? INT64_MAX : static_cast<int64_t>(best_at);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, best, o);
      const int64_t oi = __shfl_xor_sync(kFullMask, best_index, o);
      if (ov > best || (ov == best && oi < best_index)) {
        best = ov;
        best_index = oi;
      }
    }
    const bool warp_bad = __any_sync(kFullMask, bad);
    TeamShared& sh = team.sh;
    if (lane == 0) {
      sh.warp_f[warp] = best;
      sh.warp_i[warp] = best_index;
      sh.warp_n[warp] = warp_bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float bv = sh.warp_f[0];
      int64_t bi = sh.warp_i[0];
      int any_bad = sh.warp_n[0];
      for (int w = 1; w < kTeamWarps; ++w) {
        any_bad |= sh.warp_n[w];
        if (sh.warp_f[w] > bv || (sh.warp_f[w] == bv && sh.warp_i[w] < bi)) {
          bv = sh.warp_f[w];
          bi = sh.warp_i[w];
        }
      }
      TeamExchange& m = team.mine();
      m.f = bv;
      m.i = bi;
      m.flag = any_bad;
    }
    const int p = team.publish();
    float bv = -INFINITY;
    int64_t bi = INT64_MAX;
    int any_bad = 0;
    for (int r = 0; r < team.size; ++r) {
      const TeamExchange& x = team.of(r, p);
      any_bad |= x.flag;
      if (x.f > bv || (x.f == bv && x.i < bi)) {
        bv = x.f;
        bi = x.i;
      }
    }
    cached = store;
    if (any_bad || bi == INT64_MAX) return false;
    arg = bi;
    return true;
  }

  // ---- sums over the row

  // The team's per-segment sums of g(x, bits, logit) (into seg_out, every block) and their
  // total; segments in order, so a draw can find the crossing segment.
  template <bool kUnroll, typename G>
  __device__ double segment_sums(const G& g, double* seg_out) const {
    TwoSum acc;
    visit<1>(my_segment(), cached, [&](int64_t x0, const Vec& e) {
      each<kUnroll>(x0, [&](int i) { acc.add(g(x0 + i, e.get(i), E::value(e.get(i)))); });
    });
    const double warp_value = warp_sum_d(acc.value());
    if ((threadIdx.x & 31) == 0) team.mine().seg[threadIdx.x >> 5] = warp_value;
    const int p = team.publish();
    for (int k = threadIdx.x; k < segments; k += kTeamThreads)
      seg_out[k] = team.of(k / kTeamWarps, p).seg[k % kTeamWarps];
    __syncthreads();
    double total = 0.0;
    for (int k = 0; k < segments; ++k) total += seg_out[k];
    return total;
  }

  // Inverse CDF over g given its per-segment sums: the smallest x with float(cumulative) >
  // target and g(x) > 0, else the last x with g(x) > 0, else 0. The crossing segment is found
  // from the sums; its owner warp scans it (in double) and the team reads the result.
  template <typename G>
  __device__ int64_t segment_draw(const G& g, const double* seg, float target) const {
    int crossing = -1, last_positive = -1;
    double prefix = 0.0, before = 0.0;
    for (int k = 0; k < segments; ++k) {
      const double next = prefix + seg[k];
      if (seg[k] > 0.0) last_positive = k;
      if (crossing < 0 && static_cast<float>(next) > target) {
        crossing = k;
        before = prefix;
      }
      prefix = next;
    }
    const int owner_segment = crossing >= 0 ? crossing : last_positive;
    int64_t result = 0;
    if (owner_segment >= 0 && my_segment() == owner_segment) {
      result = warp_scan_segment(g, owner_segment, before, target, crossing >= 0);
      if ((threadIdx.x & 31) == 0) team.mine().i = result;
    }
    const int p = team.publish();
    if (owner_segment < 0) return 0;
    return team.of(owner_segment / kTeamWarps, p).i;
  }

  // Run by the warp that owns segment g (all its lanes): the first x whose cumulative weight
  // (base + the segment's weights so far) exceeds target, when find_first; else (or if rounding
  // leaves none) the segment's last x with positive weight.
  template <typename G>
  __device__ int64_t warp_scan_segment(const G& g, int seg, double base, float target,
                                       bool find_first) const {
    const int lane = threadIdx.x & 31;
    double running = base;
    int64_t last_positive = -1;
    const Bits* c = cache();
    for (int64_t t = seg_begin(seg); t < seg_begin(seg + 1); ++t) {
      const int64_t x0 = t * kTile + lane * VEC;
      Vec e;
      if (cached) {
        e.load_shared(c + (x0 - tile0 * kTile));
      } else {
        load_row(x0, e);
      }
      float w[VEC];
      double lane_sum = 0.0;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        w[i] = x0 + i < vocab ? g(x0 + i, e.get(i), E::value(e.get(i))) : 0.0f;
        lane_sum += w[i];
        if (w[i] > 0.0f) last_positive = x0 + i;
      }
      const double inclusive = warp_scan_d(lane_sum, lane);
      if (find_first) {
        double exclusive = __shfl_up_sync(kFullMask, inclusive, 1);
        if (lane == 0) exclusive = 0.0;
        double cumulative = running + exclusive;
        int hit = -1;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          cumulative += w[i];
          if (hit < 0 && w[i] > 0.0f && static_cast<float>(cumulative) > target) hit = i;
        }
        const unsigned hits = __ballot_sync(kFullMask, hit >= 0);
        if (hits != 0) {
          const int src = __ffs(hits) - 1;
          return __shfl_sync(kFullMask, x0 + hit, src);
        }
      }
      running += __shfl_sync(kFullMask, inclusive, 31);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t other = __shfl_xor_sync(kFullMask, last_positive, o);
      last_positive = other > last_positive ? other : last_positive;
    }
    return last_positive;
  }

  // ---- radix select

  // Count-only radix rounds over every key (the bin choice of radix_pick_top_k depends on counts
  // only); kept receives how many keys the threshold keeps (rank plus ties), and block_kept how
  // many of them lie in this block's slice.
  __device__ RadixSearch count_radix(int64_t rank, int64_t& kept, int& block_kept) {
    RadixSearch s;
    s.rank = rank;
    const int last_shift = radix_last_shift(mantissa_bits);
    const int lane = threadIdx.x & 31;
    uint32_t* columns = reinterpret_cast<uint32_t*>(dyn + lay.work);
    TeamShared& sh = team.sh;
    // Packed 16-bit counters hold a lane column of the block's slice up to 65535 elements.
    const int64_t block_tiles = seg_begin((team.rank + 1) * kTeamWarps) - tile0;
    const bool packed = block_tiles * VEC <= 65535;
    uint32_t last_count = 0;
    block_kept = 0;
    for (int shift = 24; !s.done; shift -= 8) {
      uint32_t* direct = sh.counts[team.phase];
      if (packed) {
        for (int k = threadIdx.x; k < kColumnWords; k += kTeamThreads) columns[k] = 0;
      } else {
        for (int k = threadIdx.x; k < kRadixBins; k += kTeamThreads) direct[k] = 0;
      }
      __syncthreads();
      const uint32_t prefix = s.prefix, mask = s.mask;
      const auto count_pass = [&](auto packed_tag) {
        visit<1>(my_segment(), cached, [&](int64_t x0, const Vec& e) {
          each<true>(x0, [&](int i) {
            const uint32_t key = float_key(E::value(e.get(i)));
            if ((key & mask) == prefix) {
              if constexpr (decltype(packed_tag)::value) {  // lane columns: no bank conflicts
                atomicAdd(&columns[((key >> (shift + 1)) & 0x7Fu) * 32 + lane],
                          ((key >> shift) & 1u) ? 0x10000u : 1u);
              } else {
                atomicAdd(&direct[(key >> shift) & 0xFFu], 1u);
              }
            }
          });
        });
      };
      if (packed) {
        count_pass(std::true_type{});
      } else {
        count_pass(std::false_type{});
      }
      __syncthreads();
      if (packed) {
        for (int bin = threadIdx.x; bin < kRadixBins; bin += kTeamThreads) {
          const uint32_t* words = columns + (bin >> 1) * 32;
          const int half = (bin & 1) * 16;
          uint32_t total = 0;
          for (int l = 0; l < 32; ++l) total += (words[(l + bin) & 31] >> half) & 0xFFFFu;  // no bank conflicts
          direct[bin] = total;
        }
      }
      const int p = team.publish();
      for (int bin = threadIdx.x; bin < kRadixBins; bin += kTeamThreads) {
        uint32_t total = 0;
        for (int r = 0; r < team.size; ++r) total += team.at(&sh.counts[p][0], r)[bin];
        sh.counts_total[bin] = total;
      }
      __syncthreads();
      radix_pick_top_k(s, sh.counts_total, kZeroMasses, shift, shift == last_shift);
      const int chosen = static_cast<int>((s.prefix >> shift) & 0xFFu);
      last_count = sh.counts_total[chosen];
      const uint32_t* own = sh.counts[p];  // this block's counts of the round
      for (int bin = chosen + 1; bin < kRadixBins; ++bin) block_kept += static_cast<int>(own[bin]);
      if (s.done) block_kept += static_cast<int>(own[chosen]);
    }
    kept = rank - s.rank + static_cast<int64_t>(last_count);
    return s;
  }

  // Top-p radix rounds with exact masses: floor(w * 2^64) summed as integers per bin (any order
  // gives the same sums), the mass of a bin in double from them.
  __device__ RadixSearch mass_radix(float target, uint32_t floor_key) {
    RadixSearch s;
    const int last_shift = radix_last_shift(mantissa_bits);
    FixedHistogram& h = *reinterpret_cast<FixedHistogram*>(dyn + lay.work);
    TeamShared& sh = team.sh;
    for (int shift = 24; !s.done; shift -= 8) {
      for (int k = threadIdx.x; k < kRadixBins; k += kTeamThreads) {
        h.count[k] = 0;
        h.hi[k] = 0;
        h.lo[k] = 0;
      }
      __syncthreads();
      const uint32_t prefix = s.prefix, mask = s.mask;
      visit<1>(my_segment(), cached, [&](int64_t x0, const Vec& e) {
        each<false>(x0, [&](int i) {
          const float l = E::value(e.get(i));
          const uint32_t key = float_key(l);
          if (key >= floor_key && (key & mask) == prefix) {
            const uint32_t bin = (key >> shift) & 0xFFu;
            atomicAdd(&h.count[bin], 1u);
            unsigned long long hi;
            unsigned lo;
            fixed_point(weight_of(e.get(i), l), hi, lo);
            if (hi != 0) atomicAdd(&h.hi[bin], hi);
            if (lo != 0) atomicAdd(&h.lo[bin], static_cast<unsigned long long>(lo));
          }
        });
      });
      team.sync();  // every block's histogram complete
      for (int bin = threadIdx.x; bin < kRadixBins; bin += kTeamThreads) {
        uint32_t count = 0;
        unsigned long long hi = 0, lo = 0;
        for (int r = 0; r < team.size; ++r) {
          const FixedHistogram& o = *team.at(&h, r);
          count += o.count[bin];
          hi += o.hi[bin];
          lo += o.lo[bin];
        }
        sh.counts_total[bin] = count;
        h.mass[bin] = static_cast<double>(hi) * 0x1p-32 + static_cast<double>(lo) * 0x1p-64;
      }
      team.sync();  // every block has read the others' histograms (cleared next round)
      radix_pick_top_p(s, sh.counts_total, h.mass, shift, shift == last_shift, target);
    }
    return s;
  }

  // ---- the kept-token list

  // Gathers the tokens with key >= min_key (block_count of them in this block, at most kListCap
  // in the team) into the list of every block of the team: (index, key) pairs appended in any
  // order, then sorted by index in every block, so the list is in index order and the same
  // everywhere; the weights are recomputed from the keys.
  __device__ int gather_list(uint32_t min_key, int block_count) {
    TeamShared& sh = team.sh;
    if (threadIdx.x == 0) {
      team.mine().n = block_count;
      sh.list_fill = 0;
    }
    const int p = team.publish();
    int total = 0, base = 0;
    for (int r = 0; r < team.size; ++r) {
      const int n = static_cast<int>(team.of(r, p).n);
      if (r < team.rank) base += n;
      total += n;
    }
    unsigned long long* staged = reinterpret_cast<unsigned long long*>(dyn + lay.sort);
    visit<1>(my_segment(), cached, [&](int64_t x0, const Vec& e) {
      each<true>(x0, [&](int i) {
        const uint32_t key = float_key(E::value(e.get(i)));
        if (key >= min_key) {
          const int at = base + atomicAdd(&sh.list_fill, 1);
          const unsigned long long entry = (static_cast<unsigned long long>(x0 + i) << 32) | key;
          for (int r = 0; r < team.size; ++r) team.at(staged, r)[at] = entry;
        }
      });
    });
    team.sync();  // every block's entries are in every list
    int padded = 2;
    while (padded < total) padded <<= 1;
    for (int q = total + static_cast<int>(threadIdx.x); q < padded; q += kTeamThreads) staged[q] = ~0ull;
    __syncthreads();
    block_sort_u64(staged, padded);
    for (int q = threadIdx.x; q < total; q += kTeamThreads) {
      const uint32_t key = static_cast<uint32_t>(staged[q]);
      const float l = key_float(key);
      list_index()[q] = static_cast<int>(staged[q] >> 32);
      list_key()[q] = key;
      list_weight()[q] = weight_of(E::bits(l), l);
    }
    __syncthreads();
    return total;
  }

  // The number of elements of the row in this block's slice.
  __device__ int block_elements() const {
    const int64_t begin = tile0 * kTile;
    const int64_t end_tile = seg_begin((team.rank + 1) * kTeamWarps) * kTile;
    const int64_t end = end_tile < vocab ? end_tile : vocab;
    return end > begin ? static_cast<int>(end - begin) : 0;
  }

  // Top-p on the list: sorted by key (descending, ties by index), the cumulative weight in
  // double (the reference's order); the key of the first token where float(cumulative) reaches
  // target. When the cumulative never reaches it: the smallest key if the list holds every
  // candidate (keep all), else false (the nucleus extends past the list).
  __device__ bool list_top_p(float target, bool complete, uint32_t& threshold) {
    TeamShared& sh = team.sh;
    const int n = list_size;
    int padded = 2;
    while (padded < n) padded <<= 1;
    unsigned long long* sorted = reinterpret_cast<unsigned long long*>(dyn + lay.sort);
    const uint32_t* keys = list_key();
    const float* weights = list_weight();
    for (int i = threadIdx.x; i < padded; i += kTeamThreads) {
      sorted[i] = i < n ? (static_cast<unsigned long long>(keys[i]) << 32) | (0xFFFFFFFFu - i)
                        : 0ull;  // below every key of a real logit
    }
    __syncthreads();
    block_sort_u64(sorted, padded);
    double running = 0.0;
    for (int base = 0; base < n; base += kTeamThreads) {
      const int q = base + static_cast<int>(threadIdx.x);  // rank from the top
      int position = -1;
      double w = 0.0;
      if (q < n) {
        position = static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(sorted[padded - 1 - q]));
        w = weights[position];
      }
      double block_total;
      const double cumulative = running + block_scan_d(w, block_total, sh);
      const int hit = block_min_i(q < n && static_cast<float>(cumulative) >= target ? q : INT32_MAX, sh);
      if (hit != INT32_MAX) {
        threshold = static_cast<uint32_t>(sorted[padded - 1 - hit] >> 32);
        return true;
      }
      running += block_total;
    }
    if (!complete) return false;
    threshold = static_cast<uint32_t>(sorted[padded - n] >> 32);
    return true;
  }

  __device__ bool list_kept(int q) const {
    return list_key()[q] >= filter.min_key && list_weight()[q] >= filter.min_weight;
  }

  // The draw on the list: kept entries in index order (the same rule as segment_draw).
  __device__ int64_t list_draw(float target) const {
    TeamShared& sh = team.sh;
    const int n = list_size;
    double running = 0.0;
    int last_positive = -1;
    for (int base = 0; base < n; base += kTeamThreads) {
      const int q = base + static_cast<int>(threadIdx.x);
      const float w = q < n && list_kept(q) ? list_weight()[q] : 0.0f;
      double block_total;
      const double cumulative = running + block_scan_d(w, block_total, sh);
      const int hit = block_min_i(w > 0.0f && static_cast<float>(cumulative) > target ? q : INT32_MAX, sh);
      if (hit != INT32_MAX) return list_index()[hit];
      const int lp = block_max_i(w > 0.0f ? q : -1, sh);
      if (lp >= 0) last_positive = lp;
      running += block_total;
    }
    return last_positive >= 0 ? list_index()[last_positive] : 0;
  }

  // ---- processing

  // Statistics and filters of the row (see core/sampling.h); false when the row has NaN/+Inf
  // or no finite value. `with_entropy` also computes the typical-acceptance sum A.
  __device__ bool process(const RowParams& params, bool with_entropy) {
    greedy = params.greedy();
    if (!pass_max(!greedy && can_cache)) return false;
    if (greedy) return true;

    filter = RowFilter{};
    filter.max_logit = E::value(row[arg]);
    filter.inv_temperature = div_rn(1.0f, params.temperature);
    const auto raw = [this](int64_t, Bits b, float l) { return weight_of(b, l); };

    bool list_complete = false;
    bool seg_kept_raw = false;  // seg_kept holds the sums of every weight (raw_total their total)
    float raw_total = 0.0f;
    float mass = 0.0f;  // top-k's kept mass, or the whole row's
    if (params.top_k_active(vocab)) {
      int64_t kept = 0;
      int block_kept = 0;
      const RadixSearch s = count_radix(params.top_k, kept, block_kept);
      filter.min_key = s.prefix;
      if (kept <= kListCap) {
        list_size = gather_list(filter.min_key, block_kept);
        list_complete = true;
        double local = 0.0;
        for (int q = threadIdx.x; q < list_size; q += kTeamThreads) local += list_weight()[q];
        mass = static_cast<float>(block_sum_d(local, team.sh));
      } else {
        ensure_table();
        const uint32_t min_key = filter.min_key;
        mass = static_cast<float>(segment_sums<true>(
            [&](int64_t, Bits b, float l) { return float_key(l) >= min_key ? weight_of(b, l) : 0.0f; },
            team.sh.seg_tmp));
      }
    }
    if (params.top_p_active()) {
      if (!params.top_k_active(vocab)) {
        ensure_table();
        raw_total = static_cast<float>(segment_sums<true>(raw, team.sh.seg_kept));
        seg_kept_raw = true;
        mass = raw_total;
        if (vocab > kPreselect) {
          int64_t kept = 0;
          int block_kept = 0;
          const RadixSearch s = count_radix(kPreselect, kept, block_kept);
          if (kept <= kListCap) list_size = gather_list(s.prefix, block_kept);
        } else {
          list_size = gather_list(0, block_elements());
          list_complete = true;
        }
      }
      const float target = mul_rn(params.top_p, mass);
      uint32_t threshold = 0;
      if (list_size >= 0 && list_top_p(target, list_complete, threshold)) {
        // The kept set (keys >= threshold) lies inside the list: the list holds it whole.
        if (threshold > filter.min_key) filter.min_key = threshold;
      } else {
        list_size = -1;
        ensure_table();
        const RadixSearch s = mass_radix(target, filter.min_key);
        if (s.prefix > filter.min_key) filter.min_key = s.prefix;
      }
    }
    if (params.min_p_active()) filter.min_weight = params.min_p;

    if (list_size >= 0) {
      double kept = 0.0, weighted = 0.0;
      for (int q = threadIdx.x; q < list_size; q += kTeamThreads) {
        if (!list_kept(q)) continue;
        const float w = list_weight()[q];
        kept += w;
        if (with_entropy && w > 0.0f) {
          const float l = key_float(list_key()[q]);
          weighted += mul_rn(w, mul_rn(sub_rn(l, filter.max_logit), filter.inv_temperature));
        }
      }
      filter.total = static_cast<float>(block_sum_d(kept, team.sh));
      if (with_entropy) weighted_log_sum = static_cast<float>(block_sum_d(weighted, team.sh));
      return true;
    }
    ensure_table();  // the full-row passes below and the draws
    if (filters_active()) {
      const RowFilter f = filter;
      filter.total = static_cast<float>(segment_sums<true>(
          [&](int64_t, Bits b, float l) { return f.kept_weight(l, weight_of(b, l)); },
          team.sh.seg_kept));
    } else if (seg_kept_raw) {  // the filters kept everything: the row's sums are the kept ones
      filter.total = raw_total;
    } else {
      filter.total = static_cast<float>(segment_sums<true>(raw, team.sh.seg_kept));
    }
    if (with_entropy) {
      const RowFilter f = filter;
      weighted_log_sum = static_cast<float>(segment_sums<true>(
          [&](int64_t, Bits b, float l) {
            const float w = f.kept_weight(l, weight_of(b, l));
            return w > 0.0f ? mul_rn(w, mul_rn(sub_rn(l, f.max_logit), f.inv_temperature)) : 0.0f;
          },
          team.sh.seg_tmp));
    }
    return true;
  }

  // ---- the Row interface of core/verify.h
  __device__ int64_t argmax() const { return arg; }
  __device__ float prob(int64_t x) const { return prob_of(x, E::value(row[x])); }
  __device__ float draft_prob(int64_t node, int64_t x) const {
    return draft_probs[(node + draft_row_shift) * vocab + x];
  }
  template <typename F>
  __device__ float sum(const F& f) const {
    return static_cast<float>(segment_sums<false>(
        [&](int64_t x, Bits, float l) { return f(x, prob_of(x, l)); }, team.sh.seg_tmp));
  }
  template <typename F>
  __device__ int64_t draw(const F& f, float target) const {
    const auto g = [&](int64_t x, Bits, float l) { return f(x, prob_of(x, l)); };
    segment_sums<false>(g, team.sh.seg_tmp);
    return segment_draw(g, team.sh.seg_tmp, target);
  }
  __device__ int64_t draw_target(float u) const {
    if (greedy) return arg;
    const float target = mul_rn(u, filter.total);
    if (list_size >= 0) return list_draw(target);
    const RowFilter f = filter;
    return segment_draw(
        [&](int64_t, Bits b, float l) { return f.kept_weight(l, weight_of(b, l)); },
        team.sh.seg_kept, target);
  }
  __device__ bool leader() const { return team.leader(); }
  // Every block computed the same value: each writes it (identical bits) and reads its own write.
  __device__ void publish(float* slot, float value) const {
    if (threadIdx.x == 0) *slot = value;
    __syncthreads();
  }
  __device__ float typical_threshold_for(float posterior_threshold, float posterior_alpha) const {
    return typical_threshold(filter.total, weighted_log_sum, posterior_threshold,
                             posterior_alpha);
  }
  // p over this block's slice of the row (one-hot for greedy rows).
  __device__ void write_probs(float* out) const {
    visit<1>(my_segment(), cached, [&](int64_t x0, const Vec& e) {
      each<false>(x0, [&](int i) { out[x0 + i] = prob_of(x0 + i, E::value(e.get(i))); });
    });
  }
  __device__ void write_zeros(float* out) const {
    const int64_t begin = tile0 * kTile;
    const int64_t end = begin + block_elements();
    for (int64_t x = begin + threadIdx.x; x < end; x += kTeamThreads) out[x] = 0.0f;
  }
};

}  // namespace specdec

#endif  // SPECDEC_DEVICE_CODE
