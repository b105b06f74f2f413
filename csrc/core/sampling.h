// Logits processing shared by the CPU and CUDA kernels of the sampling and verification ops
// (and mirrored operation for operation by specdec_kernels.reference). No torch includes.
//
// The processed distribution of a row of logits l[0..V) under (temperature T, top_k, top_p,
// min_p), every step in float32:
//   greedy (T == 0): one-hot at argmax l, ties to the lowest id.
//   otherwise, with M = max l and w(x) = specdec_exp((l(x) - M) * (1 / T)):
//   1. top-k (0 < top_k < V): keep x iff l(x) >= the top_k-th largest logit (ties kept).
//   2. top-p (top_p < 1): among the tokens kept so far (mass Z1), keep x iff l(x) >= L_p, the
//      largest logit whose "mass at or above it" (summed over kept tokens) is >= top_p * Z1.
//      Ties are kept; the masses are float32 roundings of sums accumulated in double.
//   3. min-p (min_p > 0): keep x iff w(x) >= min_p (i.e. p(x) >= min_p * max p).
//   p(x) = w(x) / Zk for kept x (Zk the kept mass), 0 otherwise.
// The thresholds of steps 1-2 are found without sorting, by a radix select over order-preserving
// integer keys of the logits (one pass per 8-bit digit; 2-4 passes).
//
// Arithmetic that decides anything goes through mul_rn/add_rn/sub_rn/div_rn (no FMA contraction
// on the device) and specdec_exp (a fixed polynomial), so CPU, CUDA and reference compute the
// same float32 weights bit for bit; only the order of long sums can differ.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/common.h"

namespace specdec {

// ----------------------------------------------------------------------------- float helpers

SPECDEC_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SPECDEC_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

SPECDEC_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

SPECDEC_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

SPECDEC_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

SPECDEC_HD float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

constexpr float kFloatMax = 3.40282347e+38f;

SPECDEC_HD bool is_nan_or_pos_inf(float x) { return !(x <= kFloatMax); }  // NaN or +Inf
SPECDEC_HD bool is_neg_inf(float x) { return x < -kFloatMax; }

// exp(x) for the arguments the ops use (x <= 0), 0 below -87 (so never a subnormal), within
// 2 ulp of the true value. A Cephes-style range reduction and polynomial written with
// explicitly rounded operations, so that g++, nvcc and torch (specdec_kernels.reference) all
// produce identical bits; the branch-free form lets g++ vectorise it.
SPECDEC_HD float specdec_exp(float x) {
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (ties to even).
  const float t = add_rn(mul_rn(xc, 1.44269504088896341f), 12582912.0f);
  const float n = sub_rn(t, 12582912.0f);
  const float r = sub_rn(sub_rn(xc, mul_rn(n, 0.693359375f)), mul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = add_rn(mul_rn(p, r), 1.3981999507e-3f);
  p = add_rn(mul_rn(p, r), 8.3334519073e-3f);
  p = add_rn(mul_rn(p, r), 4.1665795894e-2f);
  p = add_rn(mul_rn(p, r), 1.6666665459e-1f);
  p = add_rn(mul_rn(p, r), 5.0000001201e-1f);
  const float y = add_rn(add_rn(mul_rn(mul_rn(p, r), r), r), 1.0f);
#if defined(__CUDA_ARCH__)
  // n (an integer in [-126, 127]) sits exactly in t's low mantissa bits: the same value as the
  // cast below without a float-to-int conversion (16 per SM and clock on sm_80/sm_90, an
  // eighth of the float rate).
  const int32_t ni = static_cast<int32_t>(float_bits(t) - 0x4B400000u);
#else
  const int32_t ni = static_cast<int32_t>(n);
#endif
  const float scale = bits_float(static_cast<uint32_t>(ni + 127) << 23);
  const float result = mul_rn(y, scale);
  return x < -87.0f ? 0.0f : result;
}

// Order-preserving key of a (non-NaN) float: a < b as floats iff key(a) < key(b); -0 and +0
// share a key.
SPECDEC_HD uint32_t float_key(float f) {
  uint32_t bits = float_bits(f);
  if (bits == 0x80000000u) bits = 0;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// ----------------------------------------------------------------------------- parameters

// One request's sampling parameters (see SamplingParams in specdec_kernels/sampling.py).
struct RowParams {
  float temperature;  // 0 = greedy
  int64_t top_k;      // active iff 0 < top_k < V
  float top_p;        // active iff < 1
  float min_p;        // active iff > 0
  uint64_t seed;
  uint64_t offset;

  SPECDEC_HD bool greedy() const { return temperature == 0.0f; }
  SPECDEC_HD bool top_k_active(int64_t vocab) const { return top_k > 0 && top_k < vocab; }
  SPECDEC_HD bool top_p_active() const { return top_p < 1.0f; }
  SPECDEC_HD bool min_p_active() const { return min_p > 0.0f; }
  SPECDEC_HD bool filtered(int64_t vocab) const {
    return top_k_active(vocab) || top_p_active() || min_p_active();
  }
};

// The per-request parameters of a call, [B] each, on the kernel's device.
struct ParamPointers {
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seed;
  const int64_t* offset;

  SPECDEC_HD RowParams at(int64_t b) const {
    return {temperature[b], top_k[b], top_p[b], min_p[b], static_cast<uint64_t>(seed[b]),
            static_cast<uint64_t>(offset[b])};
  }
};

// Error kinds, in the order they are reported when a request has several. An error is encoded
// as (kind << 32) | index (index: the row or node concerned); the smallest code wins, so CPU and
// CUDA report the same error.
enum ErrorKind : uint32_t {
  kErrNone = 0,
  kErrTemperature = 1,  // temperature not 0 and not a positive float with a finite inverse
  kErrTopP = 2,         // top_p not in (0, 1]
  kErrMinP = 3,         // min_p not in [0, 1)
  kErrNumDraft = 4,     // num_draft not in [0, K]
  kErrRoot = 5,         // parents[b, 0] != -1
  kErrSecondRoot = 6,   // parents[b, j] == -1 for j > 0
  kErrParentOrder = 7,  // parents[b, j] not in [0, j) (and not -2): covers every cycle
  kErrPaddedParent = 8, // a node whose parent is a padding node (-2)
  kErrDraftToken = 9,   // a draft token outside [0, V)
  kErrDraftProb = 10,   // draft_probs at the drafted token is NaN or outside [0, 1]
  kErrLogits = 11,      // a row of target logits with NaN or +Inf, or without a finite value
};

constexpr uint64_t kNoError = ~0ull;

SPECDEC_HD uint64_t encode_error(uint32_t kind, int64_t index) {
  return (static_cast<uint64_t>(kind) << 32) | static_cast<uint32_t>(index);
}

SPECDEC_HD uint32_t check_row_params(const RowParams& p) {
  if (!(p.temperature >= 0.0f && p.temperature <= kFloatMax)) return kErrTemperature;
  if (p.temperature > 0.0f && !(1.0f / p.temperature <= kFloatMax)) return kErrTemperature;
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return kErrTopP;
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) return kErrMinP;
  return kErrNone;
}

// ----------------------------------------------------------------------------- filtering

// What a processed row keeps and its normaliser. weight() is the unnormalised kept weight.
struct RowFilter {
  float max_logit = 0.0f;        // M
  float inv_temperature = 1.0f;  // 1 / T
  uint32_t min_key = 0;          // keep keys >= min_key (top-k / top-p threshold; 0 keeps all)
  float min_weight = 0.0f;       // keep w >= min_weight (min-p)
  float total = 1.0f;            // Zk, the kept mass

  SPECDEC_HD float raw_weight(float logit) const {
    return specdec_exp(mul_rn(sub_rn(logit, max_logit), inv_temperature));
  }
  SPECDEC_HD float kept_weight(float logit, float raw) const {
    return (float_key(logit) >= min_key && raw >= min_weight) ? raw : 0.0f;
  }
  SPECDEC_HD float weight(float logit) const { return kept_weight(logit, raw_weight(logit)); }
  SPECDEC_HD float prob(float logit) const { return div_rn(weight(logit), total); }
};

// ----------------------------------------------------------------------------- bf16 weight table
//
// A bfloat16 logit has 2^16 values, so a row's raw weight is a function of the logit's 16 bits.
// Rows of bf16 logits of at least kWeightTableMinVocab tokens compute, once per row, the raw
// weights of the magnitudes [2^-8, 2^8) of both signs (16 octaves of 128 values each:
// nearly every logit) and look them up; the other values are computed. Entry k of the table
// holds raw_weight of the bf16 bits weight_table_bits(k), so a lookup gives the same bits.
constexpr int kWeightTableSpan = 2048;          // entries per sign
constexpr uint32_t kWeightTableLow = 0x3B80u;   // bf16 bits of 2^-8
constexpr int kWeightTableSignShift = 11;       // log2(kWeightTableSpan)
constexpr int64_t kWeightTableMinVocab = 16384;  // shorter rows do not pay for the table
static_assert(kWeightTableSpan == 1 << kWeightTableSignShift, "the sign picks a half by shift");

SPECDEC_HD uint32_t weight_table_bits(int k) {
  return (k >= kWeightTableSpan ? 0x8000u : 0u) + kWeightTableLow +
         static_cast<uint32_t>(k % kWeightTableSpan);
}

// The table entry of bf16 bits `b`, or -1 when the table does not hold it.
SPECDEC_HD int weight_table_index(uint32_t b) {
  const uint32_t d = (b & 0x7FFFu) - kWeightTableLow;  // wraps below the window
  if (d >= static_cast<uint32_t>(kWeightTableSpan)) return -1;
  return static_cast<int>(((b >> 15) << kWeightTableSignShift) + d);
}

// Radix select over keys, 8 bits per round from the top. The caller builds, per round, a
// 256-bin histogram (count and weight mass) of the candidate keys that match `prefix` on the
// bits already chosen, then calls one of the pick functions.
constexpr int kRadixBins = 256;

// The lowest shift whose round makes the key exact for logits of a dtype whose float32 form
// has `mantissa_bits` explicit mantissa bits (23 float, 10 half, 7 bfloat16): below it every
// key of one sign has the same bits.
SPECDEC_HD int radix_last_shift(int mantissa_bits) {
  const int constant_low_bits = 23 - mantissa_bits;
  return (constant_low_bits / 8) * 8;
}

struct RadixSearch {
  uint32_t prefix = 0;      // digits chosen so far
  uint32_t mask = 0;        // bits of prefix that are chosen
  int64_t rank = 0;         // top-k: rank (1 = largest) still wanted inside the current bucket
  double above = 0.0;       // mass of candidates with keys above the current bucket
  bool done = false;
  double kept_mass = 0.0;   // when done: mass of candidates with key >= prefix

  SPECDEC_HD bool matches(uint32_t key) const { return (key & mask) == prefix; }
  SPECDEC_HD void choose(int bin, int shift) {
    prefix |= static_cast<uint32_t>(bin) << shift;
    mask |= 0xFFu << shift;
  }
};

// Top-k: the bucket holding the rank-th largest key. Done (threshold = prefix with the lower
// bits zero) when the last round is reached or when that key is the smallest in its bucket, as
// then every key of the bucket is kept.
template <typename Count, typename Mass>
SPECDEC_HD void radix_pick_top_k(RadixSearch& s, const Count* counts, const Mass* masses,
                                 int shift, bool last) {
  int64_t seen = 0;
  int bin = kRadixBins - 1;
  for (; bin > 0; --bin) {
    const int64_t c = static_cast<int64_t>(counts[bin]);
    if (seen + c >= s.rank) break;
    seen += c;
    s.above += static_cast<double>(masses[bin]);
  }
  s.rank -= seen;
  s.choose(bin, shift);
  if (last || static_cast<int64_t>(counts[bin]) == s.rank) {
    s.done = true;
    s.kept_mass = s.above + static_cast<double>(masses[bin]);
  }
}

// Top-p: the bucket holding the largest key whose mass at or above it reaches `target`. If
// rounding leaves every bucket short, the lowest non-empty bucket (keep everything). Done when
// the last round is reached or the bucket holds a single key.
template <typename Count, typename Mass>
SPECDEC_HD void radix_pick_top_p(RadixSearch& s, const Count* counts, const Mass* masses,
                                 int shift, bool last, float target) {
  double above = s.above;
  int bin = -1, lowest = 0;
  double above_lowest = above;
  for (int j = kRadixBins - 1; j >= 0; --j) {
    if (counts[j] == 0) continue;
    const double inclusive = above + static_cast<double>(masses[j]);
    if (static_cast<float>(inclusive) >= target) {
      bin = j;
      break;
    }
    lowest = j;
    above_lowest = above;
    above = inclusive;
  }
  if (bin < 0) {
    bin = lowest;
    above = above_lowest;
  }
  s.above = above;
  s.choose(bin, shift);
  if (last || counts[bin] == 1) {
    s.done = true;
    s.kept_mass = above + static_cast<double>(masses[bin]);
  }
}

// Typical acceptance threshold min(eps, alpha * exp(-H)) of a row with kept mass Zk and
// A = sum_kept w(x) * a(x), a(x) = (l(x) - M) / T: H = log Zk - A / Zk, so
// exp(-H) = exp(A / Zk) / Zk (no log needed).
SPECDEC_HD float typical_threshold(float total, float weighted_log_sum, float posterior_threshold,
                                   float posterior_alpha) {
  const float inv_perplexity = div_rn(specdec_exp(div_rn(weighted_log_sum, total)), total);
  const float adaptive = mul_rn(posterior_alpha, inv_perplexity);
  return adaptive < posterior_threshold ? adaptive : posterior_threshold;
}

}  // namespace specdec
