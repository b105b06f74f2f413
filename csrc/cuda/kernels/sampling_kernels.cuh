// CUDA kernels of the sampling and verification ops. No torch includes.
//
// One block processes one row of logits (a node's target row, or a row of ops.sample):
//   pass 1     online max / sum of exp (and argmax, NaN/+Inf check), 16-byte vector loads;
//   2-4 passes radix select rounds, only when top-k / top-p is active (8 bits per round);
//   1 pass     the kept mass, only when some filter or typical acceptance is active;
//   then at most one early-exit scan per draw (it stops at the tile holding the drawn token)
//   and, for rejected children with draft probabilities, one pass each for the normaliser.
// Nothing of size [B, K+1, V] is written.
//
// Verification launches one block per (request, node): every node block decides its own node
// (which child is accepted, or the next token if none: kernels/verify.cuh, the same code as the
// CPU kernels) and writes a few words to a workspace; the last block of a request to finish
// (counted with an atomic) assembles the request's outputs by walking those decisions. All rows
// are therefore read in parallel, and the decisions do not depend on the block schedule.
//
// Errors: each block checks what it reads (parameters, its tree entry, its draft token and
// draft probability, its row for NaN/+Inf) and records the smallest error code of its request
// in `errors` (kNoError = all ones); a request with an error gets num_accepted 0 and tokens -1.
// The launcher raises them after the kernel unless a CUDA graph is being captured.
#pragma once

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/philox.cuh"
#include "cuda/kernels/sampling.cuh"
#include "cuda/kernels/verify.cuh"

namespace specdec {

constexpr int kMaxTeamThreads = 512;  // threads per block (one row team)
constexpr int kMaxWarps = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// VEC consecutive elements as float32; one 16-byte load when VEC * sizeof(T) == 16 (the
// launcher picks VEC > 1 only when every row start is 16-byte aligned).
template <typename T, int VEC>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[VEC]) {
  if constexpr (VEC * sizeof(T) == 16) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(p[i]);
  }
}

// Shared memory of one row team (a block). Trivial members only (no __shared__ initialisers).
struct RowShared {
  double partial_d[kMaxWarps];
  float partial_f[kMaxWarps];
  int64_t partial_i[kMaxWarps];
  unsigned long long found;
  uint32_t counts[kRadixBins];
  double masses[kRadixBins];  // double like the CPU's: float atomics would round per add
};

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ int64_t warp_max_i64(int64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int64_t other = __shfl_xor_sync(kFullMask, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// Every thread gets the same value: warp results are combined in warp order by every thread.
__device__ double block_sum(double v, RowShared& sh) {
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) sh.partial_d[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < warps; ++w) total += sh.partial_d[w];
  __syncthreads();
  return total;
}

__device__ float block_max(float v, RowShared& sh) {
  const int warps = blockDim.x / 32;
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) sh.partial_f[threadIdx.x / 32] = v;
  __syncthreads();
  float m = sh.partial_f[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, sh.partial_f[w]);
  __syncthreads();
  return m;
}

__device__ int64_t block_max_i64(int64_t v, RowShared& sh) {
  const int warps = blockDim.x / 32;
  v = warp_max_i64(v);
  if (threadIdx.x % 32 == 0) sh.partial_i[threadIdx.x / 32] = v;
  __syncthreads();
  int64_t m = sh.partial_i[0];
  for (int w = 1; w < warps; ++w) m = sh.partial_i[w] > m ? sh.partial_i[w] : m;
  __syncthreads();
  return m;
}

// The lowest index holding the maximum: (value, index) pairs, larger value first, then lower
// index. Threads without a finite value pass (-inf, INT64_MAX).
__device__ int64_t block_argmax(float value, int64_t index, RowShared& sh) {
  const int warps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, value, o);
    const int64_t oi = __shfl_xor_sync(kFullMask, index, o);
    if (ov > value || (ov == value && oi < index)) {
      value = ov;
      index = oi;
    }
  }
  if (threadIdx.x % 32 == 0) {
    sh.partial_f[threadIdx.x / 32] = value;
    sh.partial_i[threadIdx.x / 32] = index;
  }
  __syncthreads();
  float best = sh.partial_f[0];
  int64_t arg = sh.partial_i[0];
  for (int w = 1; w < warps; ++w) {
    if (sh.partial_f[w] > best || (sh.partial_f[w] == best && sh.partial_i[w] < arg)) {
      best = sh.partial_f[w];
      arg = sh.partial_i[w];
    }
  }
  __syncthreads();
  return arg;
}

// Adds (1, w) to bin `bin` of a shared histogram for every lane with `counted`, one atomic per
// distinct bin per warp (the lanes of a warp mostly share a bin in the first radix round).
// Every lane of the warp must call it.
__device__ __forceinline__ void warp_histogram_add(bool counted, int bin, float w,
                                                   uint32_t* counts, double* masses) {
  const int lane = threadIdx.x % 32;
  unsigned remaining = __ballot_sync(kFullMask, counted);
  while (remaining != 0) {
    const int leader = __ffs(remaining) - 1;
    const int leader_bin = __shfl_sync(kFullMask, bin, leader);
    const bool mine = counted && bin == leader_bin;
    const unsigned peers = __ballot_sync(kFullMask, mine);
    double sum = mine ? static_cast<double>(w) : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFullMask, sum, o);
    if (lane == leader) {
      atomicAdd(&counts[leader_bin], static_cast<uint32_t>(__popc(peers)));
      atomicAdd(&masses[leader_bin], sum);
    }
    remaining &= ~peers;
  }
}

// Exclusive prefix sum over the block in thread order; `total` receives the block's sum.
__device__ double block_exclusive_scan(double v, double& total, RowShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  double inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  double exclusive = __shfl_up_sync(kFullMask, inclusive, 1);
  if (lane == 0) exclusive = 0.0;
  if (lane == 31) sh.partial_d[warp] = inclusive;
  __syncthreads();
  double before = 0.0;
  total = 0.0;
  for (int w = 0; w < warps; ++w) {
    if (w == warp) before = total;
    total += sh.partial_d[w];
  }
  __syncthreads();
  return before + exclusive;
}

// The Row of kernels/verify.cuh on the GPU: every method is called by all threads of the block
// with the same arguments and returns the same value in every thread.
template <typename T, int VEC>
struct BlockRow {
  const T* logits;  // this row
  int64_t vocab;
  int mantissa_bits;
  RowShared& sh;
  const float* draft_probs = nullptr;  // the request's draft rows
  int64_t draft_row_shift = 0;
  bool greedy = true;
  int64_t arg = 0;
  RowFilter filter;
  float weighted_log_sum = 0.0f;

  __device__ BlockRow(const T* row, int64_t v, int mantissa, RowShared& shared)
      : logits(row), vocab(v), mantissa_bits(mantissa), sh(shared) {}

  __device__ int64_t num_chunks() const { return vocab / VEC; }

  // body(x0, vals): every chunk of VEC elements once; each thread sees its chunks in increasing
  // order (the argmax tie-break relies on it). kUnroll loads are issued before any is used, to
  // keep enough bytes in flight per SM.
  template <typename Body>
  __device__ void for_each_chunk(const Body& body) const {
    constexpr int kUnroll = 4;
    const int64_t chunks = num_chunks();
    const int64_t stride = blockDim.x;
    int64_t c = threadIdx.x;
    for (; c + (kUnroll - 1) * stride < chunks; c += kUnroll * stride) {
      float vals[kUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_floats<T, VEC>(logits + (c + u * stride) * VEC, vals[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) body((c + u * stride) * VEC, vals[u]);
    }
    for (; c < chunks; c += stride) {
      float vals[VEC];
      load_floats<T, VEC>(logits + c * VEC, vals);
      body(c * VEC, vals);
    }
  }

  // Statistics and filters of the row; false when the row has NaN/+Inf or no finite value.
  __device__ bool process(const RowParams& params, bool with_entropy) {
    greedy = params.greedy();
    const float inv_t = greedy ? 1.0f : 1.0f / params.temperature;
    float best = -INFINITY;
    int64_t best_index = INT64_MAX;
    bool bad = false;
    for_each_chunk([&](int64_t x0, const float (&l)[VEC]) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float v = l[i];
        if (is_nan_or_pos_inf(v)) {
          bad = true;
          continue;
        }
        if (is_neg_inf(v)) continue;
        if (v > best) {
          best = v;
          best_index = x0 + i;
        }
      }
    });
    if (__syncthreads_or(bad)) return false;
    arg = block_argmax(best, best_index, sh);
    if (arg == INT64_MAX) return false;  // no finite value
    if (greedy) return true;

    filter = RowFilter{};
    filter.max_logit = to_float(logits[arg]);
    filter.inv_temperature = inv_t;
    {
      // Z = float(double sum of the exact weights), as on the CPU and in the reference: an
      // online float sum would differ in the last bits and move sampling boundaries.
      double total = 0.0;
      const RowFilter f = filter;
      for_each_chunk([&](int64_t, const float (&l)[VEC]) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) total += f.raw_weight(l[i]);
      });
      filter.total = static_cast<float>(block_sum(total, sh));
    }

    float top_k_mass = filter.total;
    if (params.top_k_active(vocab)) {
      RadixSearch search;
      search.rank = params.top_k;
      radix_rounds(search, -1.0f);
      filter.min_key = search.prefix;
      top_k_mass = static_cast<float>(search.kept_mass);
    }
    if (params.top_p_active()) {
      RadixSearch search;
      radix_rounds(search, mul_rn(params.top_p, top_k_mass));
      if (search.prefix > filter.min_key) filter.min_key = search.prefix;
    }
    if (params.min_p_active()) filter.min_weight = params.min_p;
    if (params.filtered(vocab) || with_entropy) {
      double kept = 0.0, weighted = 0.0;
      const RowFilter f = filter;
      for_each_chunk([&](int64_t, const float (&l)[VEC]) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float w = f.weight(l[i]);
          kept += w;
          if (with_entropy && w > 0.0f)
            weighted += mul_rn(w, mul_rn(sub_rn(l[i], f.max_logit), f.inv_temperature));
        }
      });
      filter.total = static_cast<float>(block_sum(kept, sh));
      if (with_entropy) weighted_log_sum = static_cast<float>(block_sum(weighted, sh));
    }
    return true;
  }

  // Radix select (top-k when top_p_target < 0, else top-p above the current min_key).
  __device__ void radix_rounds(RadixSearch& search, float top_p_target) {
    const bool top_p = top_p_target >= 0.0f;
    const uint32_t floor_key = filter.min_key;
    const int last_shift = radix_last_shift(mantissa_bits);
    const RowFilter f = filter;
    for (int shift = 24; !search.done; shift -= 8) {
      for (int i = threadIdx.x; i < kRadixBins; i += blockDim.x) {
        sh.counts[i] = 0;
        sh.masses[i] = 0.0;
      }
      __syncthreads();
      const uint32_t prefix = search.prefix, mask = search.mask;
      // Warp-uniform trip count, so whole warps take part in the aggregated histogram adds.
      const int64_t chunks = num_chunks();
      const int64_t trips = (chunks + blockDim.x - 1) / blockDim.x;
      for (int64_t trip = 0; trip < trips; ++trip) {
        const int64_t c = trip * blockDim.x + threadIdx.x;
        float l[VEC] = {};
        if (c < chunks) load_floats<T, VEC>(logits + c * VEC, l);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const uint32_t key = float_key(l[i]);
          const bool counted = c < chunks && (key & mask) == prefix && key >= floor_key;
          const int bin = static_cast<int>((key >> shift) & 0xFFu);
          warp_histogram_add(counted, bin, counted ? f.raw_weight(l[i]) : 0.0f, sh.counts,
                             sh.masses);
        }
      }
      __syncthreads();
      if (top_p) {
        radix_pick_top_p(search, sh.counts, sh.masses, shift, shift == last_shift, top_p_target);
      } else {
        radix_pick_top_k(search, sh.counts, sh.masses, shift, shift == last_shift);
      }
      __syncthreads();
    }
  }

  __device__ float prob_of(int64_t x, float logit) const {
    if (greedy) return x == arg ? 1.0f : 0.0f;
    return filter.prob(logit);
  }

  // Sum over the vocabulary of g(x, logit), accumulated in double.
  template <typename G>
  __device__ float reduce(const G& g) const {
    double local = 0.0;
    for_each_chunk([&](int64_t x0, const float (&l)[VEC]) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) local += g(x0 + i, l[i]);
    });
    return static_cast<float>(block_sum(local, sh));
  }

  // Inverse CDF over weights g(x, logit): tiles of blockDim * VEC elements in index order, a
  // block scan per tile, stop at the tile where the cumulative weight first exceeds target.
  template <typename G>
  __device__ int64_t scan_draw(const G& g, float target) const {
    const int64_t chunks = num_chunks();
    if (threadIdx.x == 0) sh.found = ~0ull;
    __syncthreads();
    double running = 0.0;
    int64_t last_positive = -1;
    for (int64_t base = 0; base < chunks; base += blockDim.x) {
      const int64_t c = base + threadIdx.x;
      float w[VEC] = {};
      double local = 0.0;
      if (c < chunks) {
        float l[VEC];
        load_floats<T, VEC>(logits + c * VEC, l);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          w[i] = g(c * VEC + i, l[i]);
          local += w[i];
          if (w[i] > 0.0f) last_positive = c * VEC + i;
        }
      }
      double tile_total;
      const double before = block_exclusive_scan(local, tile_total, sh);
      if (c < chunks) {
        double cumulative = running + before;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          cumulative += w[i];
          if (static_cast<float>(cumulative) > target) {
            atomicMin(&sh.found, static_cast<unsigned long long>(c * VEC + i));
            break;
          }
        }
      }
      __syncthreads();
      const unsigned long long found = sh.found;
      __syncthreads();  // every thread has read `found` before anything reuses it
      if (found != ~0ull) return static_cast<int64_t>(found);
      running += tile_total;
    }
    const int64_t last = block_max_i64(last_positive, sh);
    return last >= 0 ? last : 0;
  }

  // ---- the Row interface of kernels/verify.cuh
  __device__ int64_t argmax() const { return arg; }
  __device__ float prob(int64_t x) const { return prob_of(x, to_float(logits[x])); }
  __device__ float draft_prob(int64_t node, int64_t x) const {
    return draft_probs[(node + draft_row_shift) * vocab + x];
  }
  template <typename F>
  __device__ float sum(const F& f) const {
    return reduce([&](int64_t x, float l) { return f(x, prob_of(x, l)); });
  }
  template <typename F>
  __device__ int64_t draw(const F& f, float target) const {
    return scan_draw([&](int64_t x, float l) { return f(x, prob_of(x, l)); }, target);
  }
  __device__ int64_t draw_target(float u) const {
    if (greedy) return arg;
    const RowFilter f = filter;
    return scan_draw([f](int64_t, float l) { return f.weight(l); }, mul_rn(u, f.total));
  }
  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ void publish(float* slot, float value) const {
    if (threadIdx.x == 0) *slot = value;
    __syncthreads();
  }
  __device__ float typical_threshold_for(float posterior_threshold, float posterior_alpha) const {
    return typical_threshold(filter.total, weighted_log_sum, posterior_threshold,
                             posterior_alpha);
  }
  __device__ void write_probs(float* out) const {
    for_each_chunk([&](int64_t x0, const float (&l)[VEC]) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[x0 + i] = prob_of(x0 + i, l[i]);
    });
  }
};

// Device pointers of the per-request parameters.
struct ParamsView {
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seed;
  const int64_t* offset;

  __device__ RowParams at(int64_t b) const {
    return {temperature[b], top_k[b], top_p[b], min_p[b], static_cast<uint64_t>(seed[b]),
            static_cast<uint64_t>(offset[b])};
  }
};

// ----------------------------------------------------------------------------- sample

// grid.x = rows; writes tokens[n] (-1 on error), probs[n, :] when probs != nullptr (zeros on
// error) and errors[n] (kNoError or the row's error code).
template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxTeamThreads) sample_kernel(const T* __restrict__ logits, int64_t vocab, int mantissa,
                              ParamsView params, int64_t* __restrict__ tokens,
                              float* __restrict__ probs, unsigned long long* __restrict__ errors) {
  __shared__ RowShared sh;
  const int64_t n = blockIdx.x;
  const RowParams p = params.at(n);
  uint64_t error = kNoError;
  const uint32_t kind = check_row_params(p);
  BlockRow<T, VEC> row(logits + n * vocab, vocab, mantissa, sh);
  if (kind != kErrNone) {
    error = encode_error(kind, 0);
  } else if (!row.process(p, false)) {
    error = encode_error(kErrLogits, n);
  }
  if (error != kNoError) {
    if (threadIdx.x == 0) {
      tokens[n] = -1;
      errors[n] = error;
    }
    if (probs != nullptr)
      for (int64_t x = threadIdx.x; x < vocab; x += blockDim.x) probs[n * vocab + x] = 0.0f;
    return;
  }
  const int64_t token = row.draw_target(uniforms_at(p.seed, p.offset, 0, kStreamSample).sample);
  if (threadIdx.x == 0) {
    tokens[n] = token;
    errors[n] = kNoError;
  }
  if (probs != nullptr) row.write_probs(probs + n * vocab);
}

// ----------------------------------------------------------------------------- verify

struct VerifyArgs {
  const void* logits;  // [B, R, V]
  int64_t batch, rows, vocab;
  int mantissa_bits;
  const int64_t* tokens;     // chain: draft_tokens [B, R-1]; tree: tree_tokens [B, R]
  const int64_t* num_draft;  // chain: [B]
  const int64_t* parents;    // tree: [B, R]
  const float* draft_probs;  // chain: [B, R-1, V]; tree: [B, R, V]; or nullptr
  ParamsView params;
  bool typical;
  float posterior_threshold, posterior_alpha;
  // workspace, [B, R] each (errors and counters [B], initialised to all ones and zeros)
  int64_t* accepted_child;
  int64_t* next_token;
  int64_t* siblings;
  float* normalisers;
  uint8_t* passed;
  int32_t* depth;
  unsigned long long* errors;
  unsigned int* counters;
  // outputs
  int64_t* out_tokens;  // [B, R]
  int64_t* out_nodes;   // tree: [B, R]; chain: nullptr
  int64_t* out_num_accepted;
};

template <bool kTree>
struct LayoutOf;

template <>
struct LayoutOf<false> {
  using type = ChainLayout;
  static constexpr int64_t kDraftRowShift = -1;
  __device__ static ChainLayout make(const VerifyArgs& a, int64_t b) {
    return ChainLayout{a.tokens + b * (a.rows - 1), a.num_draft[b]};
  }
  __device__ static int64_t draft_rows(const VerifyArgs& a) { return a.rows - 1; }
};

template <>
struct LayoutOf<true> {
  using type = TreeLayout;
  static constexpr int64_t kDraftRowShift = 0;
  __device__ static TreeLayout make(const VerifyArgs& a, int64_t b) {
    return TreeLayout{a.tokens + b * a.rows, a.parents + b * a.rows, a.rows};
  }
  __device__ static int64_t draft_rows(const VerifyArgs& a) { return a.rows; }
};

__device__ __forceinline__ uint64_t min_code(uint64_t a, uint64_t b) { return a < b ? a : b; }

// The errors node j of request b can see before reading its row (see the file comment).
template <bool kTree>
__device__ uint64_t node_input_error(const VerifyArgs& a, int64_t b, int64_t j,
                                     const RowParams& p) {
  const uint32_t kind = check_row_params(p);
  if (kind != kErrNone) return encode_error(kind, 0);
  const int64_t draft_rows = LayoutOf<kTree>::draft_rows(a);
  int64_t own_index;  // the index errors of node j's own token are reported at
  if constexpr (kTree) {
    const uint32_t tree_kind = check_tree_node(a.parents + b * a.rows, j);
    if (tree_kind != kErrNone) return encode_error(tree_kind, j);
    own_index = j;
  } else {
    const int64_t nd = a.num_draft[b];
    if (nd < 0 || nd > a.rows - 1) return encode_error(kErrNumDraft, 0);
    own_index = j - 1;
  }
  const auto layout = LayoutOf<kTree>::make(a, b);
  if (!layout.is_node(j)) return kNoError;
  uint64_t error = kNoError;
  if (j > 0) {
    const int64_t x = layout.token(j);
    if (x < 0 || x >= a.vocab) {
      error = encode_error(kErrDraftToken, own_index);
    } else if (a.draft_probs != nullptr) {
      const float q = a.draft_probs[(b * draft_rows + layout.draft_row(j)) * a.vocab + x];
      if (!(q >= 0.0f && q <= 1.0f)) error = encode_error(kErrDraftProb, own_index);
    }
  }
  for (int64_t c = layout.first_child(j); c >= 0; c = layout.next_sibling(c)) {
    const int64_t x = layout.token(c);
    if (x < 0 || x >= a.vocab)
      error = min_code(error, encode_error(kErrDraftToken, kTree ? c : c - 1));
  }
  return error;
}

// Node j's decision, written to the workspace (accepted_child / next_token / passed).
template <typename T, int VEC, bool kTree>
__device__ uint64_t decide_node(const VerifyArgs& a, int64_t b, int64_t j, const RowParams& p,
                                RowShared& sh) {
  using Layout = typename LayoutOf<kTree>::type;
  Layout layout = LayoutOf<kTree>::make(a, b);
  if constexpr (kTree) {  // node j's children are walked once per token: cache their order
    if (threadIdx.x == 0) cache_siblings(layout, j, a.siblings + b * a.rows);
    __syncthreads();
    layout.siblings = a.siblings + b * a.rows;
  }
  const T* logits = static_cast<const T*>(a.logits) + (b * a.rows + j) * a.vocab;
  BlockRow<T, VEC> row(logits, a.vocab, a.mantissa_bits, sh);
  const bool longest_path = p.greedy() || a.typical;
  if (!row.process(p, /*with_entropy=*/a.typical && !p.greedy()))
    return encode_error(kErrLogits, j);
  const int64_t slot = b * a.rows + j;
  if (longest_path) {
    const float threshold =
        p.greedy() ? 0.0f : row.typical_threshold_for(a.posterior_threshold, a.posterior_alpha);
    const bool any = judge_children(layout, row, j, p.greedy(), threshold, a.passed + b * a.rows);
    int64_t next = -1;
    if (!any) {
      const float u =
          uniforms_at(p.seed, p.offset, static_cast<uint32_t>(j), kStreamVerify).sample;
      next = row.draw_target(u);
    }
    if (threadIdx.x == 0) a.next_token[slot] = next;
  } else {
    if (a.draft_probs != nullptr) {
      row.draft_probs = a.draft_probs + b * LayoutOf<kTree>::draft_rows(a) * a.vocab;
      row.draft_row_shift = LayoutOf<kTree>::kDraftRowShift;
    }
    const SamplingDecision d = decide_sampling_node(layout, row, p, j, a.draft_probs != nullptr,
                                                    a.normalisers + b * a.rows);
    if (threadIdx.x == 0) {
      a.accepted_child[slot] = d.accepted_child;
      a.next_token[slot] = d.next_token;
    }
  }
  return kNoError;
}

__device__ __forceinline__ int64_t load_cg(const int64_t* p) {
  return static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(p)));
}

// Run by the last block of request b: outputs from the node decisions.
template <bool kTree>
__device__ void assemble_request(const VerifyArgs& a, int64_t b, const RowParams& p) {
  int64_t* tokens = a.out_tokens + b * a.rows;
  int64_t* nodes = a.out_nodes == nullptr ? nullptr : a.out_nodes + b * a.rows;
  for (int64_t i = threadIdx.x; i < a.rows; i += blockDim.x) {
    tokens[i] = -1;
    if (nodes != nullptr) nodes[i] = -1;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  a.out_num_accepted[b] = 0;
  if (__ldcg(a.errors + b) != kNoError) return;
  const auto layout = LayoutOf<kTree>::make(a, b);
  const int64_t* accepted_child = a.accepted_child + b * a.rows;
  const int64_t* next_token = a.next_token + b * a.rows;
  int64_t length = 0, last = 0;
  if (p.greedy() || a.typical) {
    const uint8_t* passed = a.passed + b * a.rows;
    int32_t* depth = a.depth + b * a.rows;
    last = deepest_accepted_node(
        layout, a.rows, [passed](int64_t c) { return __ldcg(passed + c) != 0; }, depth);
    length = write_path(layout, last, depth[last], nodes, tokens);
  } else {
    for (int64_t c = load_cg(accepted_child); c >= 0; c = load_cg(accepted_child + c)) {
      if (nodes != nullptr) nodes[length] = c;
      tokens[length] = layout.token(c);
      ++length;
      last = c;
    }
  }
  tokens[length] = load_cg(next_token + last);
  a.out_num_accepted[b] = length;
}

// grid.x = B * R blocks: block (b, j) decides node j of request b; the last block of each
// request assembles its outputs.
template <typename T, int VEC, bool kTree>
__global__ void __launch_bounds__(kMaxTeamThreads) verify_kernel(VerifyArgs a) {
  __shared__ RowShared sh;
  __shared__ bool is_last;
  const int64_t b = blockIdx.x / a.rows;
  const int64_t j = blockIdx.x % a.rows;
  const RowParams p = a.params.at(b);
  uint64_t error = node_input_error<kTree>(a, b, j, p);
  if (error == kNoError) {
    const auto layout = LayoutOf<kTree>::make(a, b);
    if (layout.is_node(j)) error = decide_node<T, VEC, kTree>(a, b, j, p, sh);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (error != kNoError) atomicMin(a.errors + b, static_cast<unsigned long long>(error));
    __threadfence();
    is_last = atomicAdd(a.counters + b, 1u) == static_cast<unsigned>(a.rows - 1);
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  assemble_request<kTree>(a, b, p);
}

}  // namespace specdec

#endif  // __CUDACC__
