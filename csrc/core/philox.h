// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind every random decision of the sampling and verification ops.
// Shared by the CPU kernels, the CUDA kernels and (re-implemented bit for bit in Python)
// specdec_kernels.reference, so all three draw the same uniforms. No torch includes.
//
// Stream layout. Request b owns the key (seed[b] low 32 bits, seed[b] high 32 bits). One
// Philox call per (offset, position, stream):
//   counter = (offset[b] low 32 bits, offset[b] high 32 bits, position, stream)
// and its four 32-bit outputs are used as
//   word 0 -> the acceptance uniform of the draft at `position` (a node index)
//   word 1 -> the sampling uniform of the target row at `position` (a node index)
//   words 2, 3 -> unused (reserved)
// `stream` separates op families that may run with the same parameters in one step:
// kStreamVerify for the verification ops, kStreamSample for ops.sample / sample_with_probs (so
// a drafter sampling with the same seed and offset never reuses a verifier's uniform).
// Offsets are advanced by the caller (e.g. tokens generated so far); distinct (offset,
// position, stream) triples give independent draws.
#pragma once

#include <cstdint>

#include "core/common.h"

namespace specdec {

constexpr uint32_t kStreamVerify = 0;
constexpr uint32_t kStreamSample = 1;

struct PhiloxOutput {
  uint32_t word[4];
};

// Philox4x32 with 10 rounds, as in Random123 (known-answer tests in python_tests/test_sampling.py).
SPECDEC_HD PhiloxOutput philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                      uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The top 24 bits of a word as a float in [0, 1): k * 2^-24 for k in [0, 2^24), exact in
// float32. A uniform is never 1; it is 0 with probability 2^-24.
SPECDEC_HD float uniform_from_word(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

struct Uniforms {
  float accept;  // decides whether the draft at this position is accepted
  float sample;  // drives the inverse-CDF draw of the next token from this position's row
};

SPECDEC_HD Uniforms uniforms_at(uint64_t seed, uint64_t offset, uint32_t position,
                                uint32_t stream) {
  const PhiloxOutput r =
      philox4x32_10(static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), position,
                    stream, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return {uniform_from_word(r.word[0]), uniform_from_word(r.word[1])};
}

}  // namespace specdec
