// One processed row of logits on the CPU: the Row of kernels/verify.cuh for the CPU kernels of
// the sampling and verification ops. A task owns one CpuRow and reuses its buffers row after
// row (the row as float32 and its weights), so nothing of size [B, K+1, V] is ever allocated.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <vector>

#include "cuda/kernels/philox.cuh"
#include "cuda/kernels/sampling.cuh"

namespace specdec {

// Whether a row has no NaN/+Inf and at least one finite value.
template <typename scalar_t>
bool row_is_valid(const scalar_t* logits, int64_t vocab) {
  int bad = 0, finite = 0;
  for (int64_t x = 0; x < vocab; ++x) {
    const float l = static_cast<float>(logits[x]);
    bad |= is_nan_or_pos_inf(l);
    finite |= !is_neg_inf(l);
  }
  return !bad && finite;
}

inline bool floats_are_valid(const float* logits, int64_t vocab) { return row_is_valid(logits, vocab); }

// w[x] = exp((l[x] - M) / T) for a whole row (a separate function so the loop vectorises).
inline void exponentiate(const float* __restrict l, float* __restrict w, int64_t vocab,
                         const RowFilter filter) {
  for (int64_t x = 0; x < vocab; ++x) w[x] = filter.raw_weight(l[x]);
}

class CpuRow {
 public:
  // Copies a row as float32 and finds its argmax (ties to the lowest id); false (and nothing
  // else to rely on) when the row has NaN/+Inf or no finite value. Split into simple loops
  // that g++ vectorises.
  template <typename scalar_t>
  bool load(const scalar_t* logits, int64_t vocab, int mantissa_bits) {
    vocab_ = vocab;
    mantissa_bits_ = mantissa_bits;
    greedy_ = true;
    logits_.resize(vocab);
    float* l = logits_.data();
    for (int64_t x = 0; x < vocab; ++x) l[x] = static_cast<float>(logits[x]);
    if (!floats_are_valid(l, vocab)) return false;
    float best = l[0];
    for (int64_t x = 1; x < vocab; ++x) best = l[x] > best ? l[x] : best;
    int64_t arg = 0;
    while (l[arg] != best) ++arg;
    argmax_ = arg;
    return true;
  }

  // A greedy row needs only its argmax: no copy (the row must be valid).
  template <typename scalar_t>
  void load_greedy(const scalar_t* logits, int64_t vocab) {
    vocab_ = vocab;
    greedy_ = true;
    float best = static_cast<float>(logits[0]);
    for (int64_t x = 1; x < vocab; ++x) {
      const float l = static_cast<float>(logits[x]);
      best = l > best ? l : best;
    }
    int64_t arg = 0;
    while (static_cast<float>(logits[arg]) != best) ++arg;
    argmax_ = arg;
  }

  // Applies temperature, top-k, top-p and min-p (see kernels/sampling.cuh). Greedy rows need
  // nothing beyond load(). `with_entropy` also computes the typical-acceptance sum A.
  void process(const RowParams& params, bool with_entropy) {
    greedy_ = params.greedy();
    if (greedy_) return;
    filter_ = RowFilter{};
    filter_.max_logit = logits_[argmax_];
    filter_.inv_temperature = 1.0f / params.temperature;
    weights_.resize(vocab_);
    const float* l = logits_.data();
    float* w = weights_.data();
    exponentiate(l, w, vocab_, filter_);
    double total = 0.0;
    for (int64_t x = 0; x < vocab_; ++x) total += w[x];

    float top_k_mass = static_cast<float>(total);
    if (params.top_k_active(vocab_)) {
      RadixSearch s;
      s.rank = params.top_k;
      radix_rounds(s, /*top_p_target=*/-1.0f);
      filter_.min_key = s.prefix;
      top_k_mass = static_cast<float>(s.kept_mass);
    }
    if (params.top_p_active()) {
      RadixSearch s;
      radix_rounds(s, mul_rn(params.top_p, top_k_mass));
      // An early stop leaves the low bits of the prefix zero: never go below top-k's threshold.
      if (s.prefix > filter_.min_key) filter_.min_key = s.prefix;
    }
    if (params.min_p_active()) filter_.min_weight = params.min_p;
    if (params.filtered(vocab_)) {
      total = 0.0;
      for (int64_t x = 0; x < vocab_; ++x) total += filter_.kept_weight(l[x], w[x]);
    }
    filter_.total = static_cast<float>(total);
    if (with_entropy) {
      double a = 0.0;
      for (int64_t x = 0; x < vocab_; ++x) {
        const float kept = filter_.kept_weight(l[x], w[x]);
        if (kept > 0.0f)
          a += mul_rn(kept, mul_rn(sub_rn(l[x], filter_.max_logit), filter_.inv_temperature));
      }
      weighted_log_sum_ = static_cast<float>(a);
    }
  }

  void set_draft_probs(const float* base, int64_t row_shift) {
    draft_probs_ = base;
    draft_row_shift_ = row_shift;
  }

  // ---- the Row interface of kernels/verify.cuh
  int64_t argmax() const { return argmax_; }
  float prob(int64_t x) const {
    if (greedy_) return x == argmax_ ? 1.0f : 0.0f;
    return div_rn(filter_.kept_weight(logits_[x], weights_[x]), filter_.total);
  }
  float draft_prob(int64_t node, int64_t x) const {
    return draft_probs_[(node + draft_row_shift_) * vocab_ + x];
  }
  template <typename F>
  float sum(const F& f) const {
    double total = 0.0;
    for (int64_t x = 0; x < vocab_; ++x) total += f(x, prob(x));
    return static_cast<float>(total);
  }
  template <typename F>
  int64_t draw(const F& f, float target) const {
    double cumulative = 0.0;
    int64_t last_positive = 0;
    for (int64_t x = 0; x < vocab_; ++x) {
      const float weight = f(x, prob(x));
      cumulative += weight;
      if (static_cast<float>(cumulative) > target) return x;
      if (weight > 0.0f) last_positive = x;
    }
    return last_positive;
  }
  int64_t draw_target(float u) const {
    if (greedy_) return argmax_;
    const float target = mul_rn(u, filter_.total);
    double cumulative = 0.0;
    int64_t last_positive = 0;
    for (int64_t x = 0; x < vocab_; ++x) {
      const float weight = filter_.kept_weight(logits_[x], weights_[x]);
      cumulative += weight;
      if (static_cast<float>(cumulative) > target) return x;
      if (weight > 0.0f) last_positive = x;
    }
    return last_positive;
  }
  bool leader() const { return true; }
  void publish(float* slot, float value) const { *slot = value; }

  float typical_threshold_for(float posterior_threshold, float posterior_alpha) const {
    return typical_threshold(filter_.total, weighted_log_sum_, posterior_threshold,
                             posterior_alpha);
  }
  // p over the whole vocabulary (one-hot for greedy rows).
  void write_probs(float* out) const {
    for (int64_t x = 0; x < vocab_; ++x) out[x] = prob(x);
  }

 private:
  // Radix select: top-k when top_p_target < 0 (rank preset in s), else top-p among the keys
  // kept by the current filter_.min_key. The first round visits the whole row; later rounds
  // only the candidates left in the chosen bucket (gathered after each round).
  void radix_rounds(RadixSearch& s, float top_p_target) {
    const bool top_p = top_p_target >= 0.0f;
    const uint32_t floor_key = filter_.min_key;
    const int last_shift = radix_last_shift(mantissa_bits_);
    keys_.resize(vocab_);
    for (int64_t x = 0; x < vocab_; ++x) keys_[x] = float_key(logits_[x]);
    candidates_.clear();
    bool whole_row = true;
    for (int shift = 24; !s.done; shift -= 8) {
      int64_t counts[kRadixBins] = {};
      double masses[kRadixBins] = {};
      auto count = [&](int64_t x) {
        const int bin = static_cast<int>((keys_[x] >> shift) & 0xFFu);
        counts[bin] += 1;
        masses[bin] += weights_[x];
      };
      if (whole_row) {
        for (int64_t x = 0; x < vocab_; ++x)
          if (keys_[x] >= floor_key) count(x);
      } else {
        for (const int32_t x : candidates_) count(x);
      }
      if (top_p) {
        radix_pick_top_p(s, counts, masses, shift, shift == last_shift, top_p_target);
      } else {
        radix_pick_top_k(s, counts, masses, shift, shift == last_shift);
      }
      if (s.done) break;
      if (whole_row) {
        for (int64_t x = 0; x < vocab_; ++x)
          if (keys_[x] >= floor_key && s.matches(keys_[x])) candidates_.push_back(static_cast<int32_t>(x));
        whole_row = false;
      } else {
        size_t kept = 0;
        for (const int32_t x : candidates_)
          if (s.matches(keys_[x])) candidates_[kept++] = x;
        candidates_.resize(kept);
      }
    }
  }

  int64_t vocab_ = 0;
  int mantissa_bits_ = 23;
  bool greedy_ = true;
  int64_t argmax_ = 0;
  RowFilter filter_;
  float weighted_log_sum_ = 0.0f;
  std::vector<float> logits_;
  std::vector<float> weights_;
  std::vector<uint32_t> keys_;        // order-preserving keys of the row (radix select)
  std::vector<int32_t> candidates_;   // radix select: indices still in the chosen bucket
  const float* draft_probs_ = nullptr;
  int64_t draft_row_shift_ = 0;
};

}  // namespace specdec
