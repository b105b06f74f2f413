// SIMD building blocks of the CPU kernels, chosen at run time (csrc/linear.cpp,
// csrc/tree.cpp, csrc/sampling_cpu.h). x86-64 code paths are compiled with function-level
// target attributes, so one binary carries AVX-512, AVX2 and portable code and picks by CPUID;
// other architectures get the portable code only.
//
// Every reduction here has a fixed order that depends only on the reduced length, never on how
// many rows are processed together or where a row sits: that is what makes the kernels that
// use them batch-invariant.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECDEC_X86 1
#include <immintrin.h>
// GCC 12 reports its own _mm512_undefined_* idiom (self-initialisation) inside the intrinsics
// headers as uninitialised use wherever they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define SPECDEC_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define SPECDEC_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#define SPECDEC_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define SPECDEC_X86 0
#endif

namespace specdec {
namespace simd {

// Instruction-set levels, lowest first. A kernel runs the best level it has at or below
// max_level().
enum Level : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

inline const char* level_name(int level) {
  switch (level) {
    case kAvx512Bf16: return "avx512_bf16";
    case kAvx512: return "avx512";
    case kAvx2: return "avx2";
    default: return "portable";
  }
}

// What this CPU supports.
inline int detected_level() {
#if SPECDEC_X86
  static const int level = [] {
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (avx512 && __builtin_cpu_supports("avx512bf16")) return static_cast<int>(kAvx512Bf16);
    if (avx512) return static_cast<int>(kAvx512);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
      return static_cast<int>(kAvx2);
    return static_cast<int>(kPortable);
  }();
  return level;
#else
  return kPortable;
#endif
}

// A cap on the level (tests run every code path on one machine); -1 = no cap. Read once from
// SPECDEC_CPU_ISA (portable, avx2, avx512, avx512_bf16), changeable through set_level_cap.
inline std::atomic<int>& level_cap() {
  static std::atomic<int> cap{[] {
    const char* env = std::getenv("SPECDEC_CPU_ISA");
    if (env == nullptr) return -1;
    for (int level = kPortable; level <= kAvx512Bf16; ++level)
      if (std::strcmp(env, level_name(level)) == 0) return level;
    return -1;
  }()};
  return cap;
}

inline int max_level() {
  const int detected = detected_level();
  const int cap = level_cap().load(std::memory_order_relaxed);
  return cap >= 0 && cap < detected ? cap : detected;
}

#if SPECDEC_X86
// Sum of the 16 lanes, always in the same order: halves, then quarters, then pairs.
SPECDEC_TARGET_AVX512 inline float reduce_add(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// Sum of the 8 lanes in a fixed order.
SPECDEC_TARGET_AVX2 inline float reduce_add(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// reduce_add of four vectors at once, bit for bit (the same pairs added in the same order:
// lanes i + 8, then i + 4, then (0 + 2) + (1 + 3)), the four sums in one vector. With the min
// term folded in, it took a 4 x 4 int4 tile at K = 576 from 8.7 to 7.5 cycles per chunk (one
// thread, in cache). reduce_add_each below has an AVX-512 and an AVX2 twin, as reduce_add:
// one template cannot carry both targets.
SPECDEC_TARGET_AVX512 inline __m128 reduce_add4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit lane k: the 4 partial sums of input k.
  const __m512 s4 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, 0xEE));
  const __m512 s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, 0x55));
  const __m512i first_lanes = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first_lanes, s1));
}

// reduce_add of four 8-lane vectors at once, bit for bit (lanes i + 4, then (0 + 2) + (1 + 3)).
SPECDEC_TARGET_AVX2 inline __m128 reduce_add4(__m256 a, __m256 b, __m256 c, __m256 d) {
  // 128-bit half 0: a's (c's) 4 partial sums, half 1: b's (d's).
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  const __m256 ab2 = _mm256_add_ps(ab, _mm256_permute_ps(ab, 0xEE));
  const __m256 cd2 = _mm256_add_ps(cd, _mm256_permute_ps(cd, 0xEE));
  const __m256 ab1 = _mm256_add_ps(ab2, _mm256_permute_ps(ab2, 0x55));
  const __m256 cd1 = _mm256_add_ps(cd2, _mm256_permute_ps(cd2, 0x55));
  const __m256 mixed = _mm256_unpacklo_ps(ab1, cd1);  // a c . . | b d . .
  return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(mixed, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)));
}

// sums[n] = reduce_add(v[n]) for n < N, four at a time.
template <int N>
SPECDEC_TARGET_AVX512 inline void reduce_add_each(const __m512 (&v)[N], float* sums) {
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int n = 0; n < N; n += 4) {
    const int left = N - n;
    const __m128 s = reduce_add4(v[n], left > 1 ? v[n + 1] : zero, left > 2 ? v[n + 2] : zero,
                                 left > 3 ? v[n + 3] : zero);
    if (left >= 4) {
      _mm_storeu_ps(sums + n, s);
    } else {
      _mm_mask_storeu_ps(sums + n, static_cast<__mmask8>((1u << left) - 1u), s);
    }
  }
}

template <int N>
SPECDEC_TARGET_AVX2 inline void reduce_add_each(const __m256 (&v)[N], float* sums) {
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int n = 0; n < N; n += 4) {
    const int left = N - n;
    const __m128 s = reduce_add4(v[n], left > 1 ? v[n + 1] : zero, left > 2 ? v[n + 2] : zero,
                                 left > 3 ? v[n + 3] : zero);
    if (left >= 4) {
      _mm_storeu_ps(sums + n, s);
    } else {
      alignas(16) float part[4];
      _mm_store_ps(part, s);
      for (int i = 0; i < left; ++i) sums[n + i] = part[i];
    }
  }
}

// 16 bfloat16 values (raw bits) to float32: the bits shifted into the high half.
SPECDEC_TARGET_AVX512 inline __m512 bf16_to_f32(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

SPECDEC_TARGET_AVX2 inline __m256 bf16_to_f32(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// specdec_exp (core/sampling.h) on 16 lanes: the same operations in the same order,
// none fused, so every lane is bit-identical to the scalar function. Inputs are never NaN.
SPECDEC_TARGET_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 big = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(
      _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), big), big);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(
      _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 result = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(underflow, result, _mm512_setzero_ps());
}

// exp16 on 8 lanes (AVX2): the same operations in the same order, bit-identical to specdec_exp.
SPECDEC_TARGET_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 big = _mm256_set1_ps(12582912.0f);
  const __m256 n = _mm256_sub_ps(
      _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), big), big);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(
      _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  return _mm256_andnot_ps(underflow, result);
}
#endif

// float32 -> bfloat16 bits, round to nearest even (NaN stays NaN), as c10::BFloat16 does.
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float bf16_bits_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace simd
}  // namespace specdec
