// One processed row of logits on the CPU: the Row of core/verify.h for the CPU kernels of
// the sampling and verification ops. A task owns one CpuRow and reuses its buffers row after
// row, so nothing of size [B, K+1, V] is ever allocated.
//
// Passes over a row (cpu_rows.h, vectorised): the launcher's scan finds validity and the argmax
// (all a greedy row needs); a sampled row is copied as float32 once, then one exp-sum pass
// gives its mass per chunk. Top-k / top-p select among candidates gathered from the row (every
// token at or above a bound that provably keeps the selection exact), so the radix select runs
// on a few hundred keys instead of the whole row; weights are recomputed where needed (exact:
// the same float operations) rather than stored, and long bf16 rows look most of them up in a
// per-row table (core/sampling.h), built the first time a pass over the whole row needs them.
// Rows can be split over threads by chunks when there are fewer rows than threads; sums do not
// depend on the split.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu_rows.h"
#include "core/philox.h"
#include "core/sampling.h"

namespace specdec {

// Validity and argmax of a whole row (split over threads when `parallel`).
template <typename scalar_t>
rows::Scan scan_row(const scalar_t* logits, int64_t vocab, bool parallel) {
  const int64_t chunks = rows::num_chunks(vocab);
  if (!parallel || chunks == 1) return rows::scan(logits, 0, vocab);
  std::vector<rows::Scan> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      parts[c] = rows::scan(logits, c * rows::kChunk, std::min(vocab, (c + 1) * rows::kChunk));
  });
  rows::Scan s = parts[0];
  for (int64_t c = 1; c < chunks; ++c) s.merge(parts[c]);
  return s;
}

class CpuRow {
 public:
  // Whether the row's per-chunk passes may use at::parallel_for (the caller is not inside a
  // parallel region and has fewer rows than threads).
  void set_parallel(bool parallel) { parallel_ = parallel; }

  // A greedy row needs only its argmax, known from the scan.
  void load_greedy(int64_t vocab, const rows::Scan& scan) {
    vocab_ = vocab;
    greedy_ = true;
    argmax_ = scan.argmax;
    max_logit_ = scan.max;
  }

  // A row to be processed: copied as float32 in the same pass that scans it. Returns the scan;
  // nothing else is meaningful unless it is valid.
  template <typename scalar_t>
  rows::Scan load(const scalar_t* logits, int64_t vocab, int mantissa_bits) {
    vocab_ = vocab;
    mantissa_bits_ = mantissa_bits;
    // The float32 copy of a bf16 logit keeps its 16 bits on top: the table's index.
    table_allowed_ = std::is_same_v<scalar_t, c10::BFloat16> && vocab >= kWeightTableMinVocab;
    logits_.resize(vocab);
    const int64_t chunks = rows::num_chunks(vocab);
    block_max_.resize((vocab + rows::kBlock - 1) / rows::kBlock);
    chunk_scans_.resize(chunks);
    float* l = logits_.data();
    for_chunks([&](int64_t begin, int64_t end) {
      chunk_scans_[begin / rows::kChunk] = rows::copy_scan(logits, l, begin, end, block_max_.data());
    });
    rows::Scan scan = chunk_scans_[0];
    for (int64_t c = 1; c < chunks; ++c) scan.merge(chunk_scans_[c]);
    load_greedy(vocab, scan);
    probs_ready_ = false;
    return scan;
  }

  // Applies temperature, top-k, top-p and min-p (see core/sampling.h). Greedy rows need
  // nothing beyond load(). `with_entropy` also computes the typical-acceptance sum A.
  void process(const RowParams& params, bool with_entropy) {
    greedy_ = params.greedy();
    probs_ready_ = false;
    table_ready_ = false;
    if (greedy_) return;
    filter_ = RowFilter{};
    filter_.max_logit = max_logit_;
    filter_.inv_temperature = 1.0f / params.temperature;
    selected_ = false;
    if (!params.filtered(vocab_)) {
      filter_.total = static_cast<float>(chunk_sums(0.0f, with_entropy));
      return;
    }
    // Top-k's kept mass, or else the whole mass, is what top-p takes its share of.
    float top_k_mass = 0.0f;
    if (params.top_k_active(vocab_)) {
      top_k_mass = select_top_k(params.top_k);
    } else if (params.top_p_active()) {
      top_k_mass = static_cast<float>(chunk_sums(0.0f, false));
    }
    if (params.top_p_active()) select_top_p(mul_rn(params.top_p, top_k_mass));
    if (params.min_p_active()) filter_.min_weight = params.min_p;
    filter_.total = static_cast<float>(selected_ ? selected_mass(with_entropy)
                                                 : chunk_sums(filter_.min_weight, with_entropy));
  }

  void set_draft_probs(const float* base, int64_t row_shift) {
    draft_probs_ = base;
    draft_row_shift_ = row_shift;
  }

  // ---- the Row interface of core/verify.h
  int64_t argmax() const { return argmax_; }
  float prob(int64_t x) const {
    if (greedy_) return x == argmax_ ? 1.0f : 0.0f;
    if (probs_ready_) return probs_[x];
    return div_rn(filter_.weight(logits_[x]), filter_.total);
  }
  float draft_prob(int64_t node, int64_t x) const {
    return draft_probs_[(node + draft_row_shift_) * vocab_ + x];
  }
  template <typename F>
  float sum(const F& f) const {
    materialize_probs();
    double total = 0.0;
    for (int64_t x = 0; x < vocab_; ++x) total += f(x, probs_[x]);
    return static_cast<float>(total);
  }
  template <typename F>
  int64_t draw(const F& f, float target) const {
    materialize_probs();
    double cumulative = 0.0;
    int64_t last_positive = 0;
    for (int64_t x = 0; x < vocab_; ++x) {
      const float weight = f(x, probs_[x]);
      cumulative += weight;
      if (static_cast<float>(cumulative) > target) return x;
      if (weight > 0.0f) last_positive = x;
    }
    return last_positive;
  }
  // Inverse-CDF draw from p: the smallest x whose cumulative kept weight exceeds u * Zk.
  int64_t draw_target(float u) const {
    if (greedy_) return argmax_;
    const float target = mul_rn(u, filter_.total);
    if (selected_) return draw_among_selected(target);
    double cumulative = 0.0;
    for (int64_t c = 0; c < static_cast<int64_t>(chunk_sums_.size()); ++c) {
      // Skip whole chunks by their sums; scan token by token from the chunk that crosses.
      if (static_cast<float>(cumulative + chunk_sums_[c]) > target) {
        const int64_t found = scan_for(target, c * rows::kChunk, cumulative);
        if (found >= 0) return found;
        break;
      }
      cumulative += chunk_sums_[c];
    }
    return last_kept_token();
  }
  bool leader() const { return true; }
  void publish(float* slot, float value) const { *slot = value; }

  float typical_threshold_for(float posterior_threshold, float posterior_alpha) const {
    return typical_threshold(filter_.total, weighted_log_sum_, posterior_threshold,
                             posterior_alpha);
  }
  // p over the whole vocabulary (one-hot for greedy rows).
  void write_probs(float* out) const {
    if (greedy_) {
      std::fill(out, out + vocab_, 0.0f);
      out[argmax_] = 1.0f;
      return;
    }
    const float* l = logits_.data();
    const float* table = weight_table();
    for_chunks([&](int64_t begin, int64_t end) {
      rows::write_probs(l, begin, end, filter_, table, out);
    });
  }

 private:
  template <typename F>
  void for_chunks(const F& f) const {
    const int64_t chunks = rows::num_chunks(vocab_);
    auto run = [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        f(c * rows::kChunk, std::min(vocab_, (c + 1) * rows::kChunk));
    };
    if (parallel_ && chunks > 1) {
      at::parallel_for(0, chunks, 1, run);
    } else {
      run(0, chunks);
    }
  }

  // Per-chunk sums of the weights w >= min_weight (all when 0) into chunk_sums_, and their
  // total; with `entropy` also A into weighted_log_sum_.
  double chunk_sums(float min_weight, bool entropy) {
    const int64_t chunks = rows::num_chunks(vocab_);
    chunk_sums_.assign(chunks, 0.0);
    chunk_entropy_.assign(chunks, 0.0);
    const float* l = logits_.data();
    const float* table = weight_table();
    for_chunks([&](int64_t begin, int64_t end) {
      const int64_t c = begin / rows::kChunk;
      rows::exp_sum(l, begin, end, filter_.max_logit, filter_.inv_temperature, min_weight, table,
                    &chunk_sums_[c], entropy ? &chunk_entropy_[c] : nullptr);
    });
    double total = 0.0, a = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      total += chunk_sums_[c];
      a += chunk_entropy_[c];
    }
    if (entropy) weighted_log_sum_ = static_cast<float>(a);
    return total;
  }

  // ---- top-k / top-p among candidates
  //
  // Candidates: every token whose logit is at least `bound`, in index order (only blocks whose
  // maximum reaches the bound are read). A bound at or below the selection's threshold makes
  // the radix select over the candidates exact; then every kept token is a candidate.

  // The n-th largest of the block maxima (from load: the largest logit of each block of
  // rows::kBlock tokens), n >= 1; -inf past the last block. n tokens reach it.
  float block_bound(int64_t n) {
    if (n > static_cast<int64_t>(block_max_.size())) return -std::numeric_limits<float>::infinity();
    ranked_blocks_.assign(block_max_.begin(), block_max_.end());
    std::nth_element(ranked_blocks_.begin(), ranked_blocks_.begin() + (n - 1), ranked_blocks_.end(),
                     [](float a, float b) { return a > b; });
    return ranked_blocks_[n - 1];
  }

  void gather_candidates(float bound) {
    // A buffer that only grows, so gathering never clears a vocabulary-sized array.
    if (static_cast<int64_t>(gather_buffer_.size()) < vocab_ + 16) gather_buffer_.resize(vocab_ + 16);
    int64_t n = 0;
    for (int64_t b = 0; b < static_cast<int64_t>(block_max_.size()); ++b) {
      if (!(block_max_[b] >= bound)) continue;  // the block holds no candidate
      const int64_t begin = b * rows::kBlock;
      n += rows::gather_at_least(logits_.data(), begin, std::min(vocab_, begin + rows::kBlock),
                                 bound, gather_buffer_.data() + n);
    }
    candidates_.assign(gather_buffer_.begin(), gather_buffer_.begin() + n);
    keys_.resize(n);
    weights_.resize(n);
    rows::keys_and_weights(logits_.data(), candidates_.data(), n, filter_.max_logit,
                           filter_.inv_temperature, keys_.data(), weights_.data());
  }

  // Top-k: the k-th largest of the block maxima bounds the k-th largest logit from below (k
  // distinct tokens reach it). Returns the kept mass (float).
  float select_top_k(int64_t k) {
    gather_candidates(block_bound(k));
    whole_row_ = static_cast<int64_t>(candidates_.size()) == vocab_;
    RadixSearch s;
    s.rank = k;
    radix_rounds(s, /*top_p_target=*/-1.0f);
    filter_.min_key = s.prefix;
    selected_ = true;
    return static_cast<float>(s.kept_mass);
  }

  // Top-p: lower the bound (block maxima, then everything) until the candidates at or above it
  // carry the target mass; the threshold then lies among them.
  void select_top_p(float target) {
    if (!selected_) {
      int64_t take = 16;
      while (true) {
        const bool all = take > static_cast<int64_t>(block_max_.size());
        gather_candidates(block_bound(take));
        double mass = 0.0;
        for (size_t i = 0; i < weights_.size(); ++i) mass += weights_[i];
        if (all || static_cast<float>(mass) >= target) break;
        take *= 4;
      }
      whole_row_ = static_cast<int64_t>(candidates_.size()) == vocab_;
    }
    RadixSearch s;
    radix_rounds(s, target);
    // An early stop leaves the low bits of the prefix zero: never go below top-k's threshold.
    if (s.prefix > filter_.min_key) filter_.min_key = s.prefix;
    selected_ = true;
  }

  // Radix select over the candidates' keys at or above filter_.min_key: top-k when
  // top_p_target < 0 (rank preset in s), else top-p. Candidates may leave out tokens below
  // the threshold, so a bucket only counts as complete (early stop) when it is the lowest
  // round; otherwise digits are chosen down to the exact key.
  void radix_rounds(RadixSearch& s, float top_p_target) {
    const bool top_p = top_p_target >= 0.0f;
    const uint32_t floor_key = filter_.min_key;
    const int last_shift = radix_last_shift(mantissa_bits_);
    live_.clear();
    for (int64_t i = 0; i < static_cast<int64_t>(keys_.size()); ++i)
      if (keys_[i] >= floor_key) live_.push_back(static_cast<int32_t>(i));
    for (int shift = 24; !s.done; shift -= 8) {
      int64_t counts[kRadixBins] = {};
      double masses[kRadixBins] = {};
      for (const int32_t i : live_) {
        const int bin = static_cast<int>((keys_[i] >> shift) & 0xFFu);
        counts[bin] += 1;
        masses[bin] += weights_[i];
      }
      const bool last = shift == last_shift;
      if (top_p) {
        radix_pick_top_p(s, counts, masses, shift, last, top_p_target);
      } else {
        radix_pick_top_k(s, counts, masses, shift, last);
      }
      // An early stop keeps the whole bucket, which is only right when the counts cover the
      // whole row: candidates do not, so refine down to the exact key instead.
      if (!last && !whole_row_) s.done = false;
      if (s.done) break;
      size_t kept = 0;
      for (const int32_t i : live_)
        if (s.matches(keys_[i])) live_[kept++] = i;
      live_.resize(kept);
    }
  }

  // The kept mass (and A) summed over the candidates in index order.
  double selected_mass(bool entropy) {
    double total = 0.0, a = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const float kept = filter_.kept_weight(logits_[candidates_[i]], weights_[i]);
      total += kept;
      if (entropy && kept > 0.0f)
        a += mul_rn(kept, mul_rn(sub_rn(logits_[candidates_[i]], filter_.max_logit),
                                 filter_.inv_temperature));
    }
    if (entropy) weighted_log_sum_ = static_cast<float>(a);
    return total;
  }

  int64_t draw_among_selected(float target) const {
    double cumulative = 0.0;
    int64_t last_positive = candidates_.empty() ? 0 : candidates_[0];
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const float weight = filter_.kept_weight(logits_[candidates_[i]], weights_[i]);
      cumulative += weight;
      if (static_cast<float>(cumulative) > target) return candidates_[i];
      if (weight > 0.0f) last_positive = candidates_[i];
    }
    return last_positive;
  }

  // The first token from `begin` on whose cumulative kept weight exceeds target, or -1:
  // blocks of rows::kBlock tokens are skipped by their sums, then tokens are added one by one.
  int64_t scan_for(float target, int64_t begin, double cumulative) const {
    for (int64_t b = begin; b < vocab_; b += rows::kBlock) {
      const int64_t end = std::min(vocab_, b + rows::kBlock);
      double block = 0.0;
      rows::exp_sum(logits_.data(), b, end, filter_.max_logit, filter_.inv_temperature,
                    filter_.min_weight, weight_table(), &block, nullptr);
      if (!(static_cast<float>(cumulative + block) > target)) {
        cumulative += block;
        continue;
      }
      for (int64_t x = b; x < vocab_; ++x) {
        cumulative += filter_.weight(logits_[x]);
        if (static_cast<float>(cumulative) > target) return x;
      }
      return -1;
    }
    return -1;
  }

  int64_t last_kept_token() const {
    for (int64_t x = vocab_ - 1; x > 0; --x)
      if (filter_.weight(logits_[x]) > 0.0f) return x;
    return 0;
  }

  // The processed row's weight table, built on first use (before any parallel pass), or
  // nullptr when the row has none.
  const float* weight_table() const {
    if (!table_allowed_) return nullptr;
    if (!table_ready_) {
      table_.resize(2 * kWeightTableSpan);
      rows::weight_table(filter_.max_logit, filter_.inv_temperature, table_.data());
      table_ready_ = true;
    }
    return table_.data();
  }

  // p(x) for every x, for the generic sums and draws of the residual distributions.
  void materialize_probs() const {
    if (probs_ready_) return;
    probs_.resize(vocab_);
    write_probs(probs_.data());
    probs_ready_ = true;
  }

  int64_t vocab_ = 0;
  int mantissa_bits_ = 23;
  bool parallel_ = false;
  bool greedy_ = true;
  bool selected_ = false;  // top-k / top-p chose among candidates_
  bool whole_row_ = false;  // candidates_ holds every token
  int64_t argmax_ = 0;
  float max_logit_ = 0.0f;
  RowFilter filter_;
  float weighted_log_sum_ = 0.0f;
  std::vector<float> logits_;
  std::vector<double> chunk_sums_, chunk_entropy_;
  std::vector<float> block_max_;     // the largest logit of each block of rows::kBlock tokens
  std::vector<float> ranked_blocks_;  // block_max_, partly sorted by block_bound
  std::vector<rows::Scan> chunk_scans_;
  std::vector<int32_t> gather_buffer_;
  std::vector<int32_t> candidates_;  // token ids, ascending
  std::vector<uint32_t> keys_;       // their order-preserving keys
  std::vector<float> weights_;       // their raw weights
  std::vector<int32_t> live_;        // radix select: candidates still in the chosen bucket
  mutable std::vector<float> probs_;
  mutable bool probs_ready_ = false;
  bool table_allowed_ = false;        // bf16 logits, a row long enough for the table
  mutable std::vector<float> table_;  // the weight table of the row as processed
  mutable bool table_ready_ = false;
  const float* draft_probs_ = nullptr;
  int64_t draft_row_shift_ = 0;
};

}  // namespace specdec
