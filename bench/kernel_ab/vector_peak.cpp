// The vector peak of one core: independent chains of vpdpbusd (int8 dot products, 64
// multiply-adds each) and of vfmadd231ps on zmm registers, and of vfmadd231ps on ymm
// registers (the AVX2 path's peak), so the tiles' rates can be read as a share of what the
// core can do. Run two copies pinned to two cores
// (`taskset -c 0 ./peak & taskset -c 1 ./peak`) to see whether the cores share vector units.
//
//   g++ -O2 bench/kernel_ab/vector_peak.cpp -o /tmp/peak && /tmp/peak
#include <immintrin.h>

#include <chrono>
#include <cstdio>

// 12 independent accumulators in registers: more than the pipes times the latency.
#define EACH(OP) OP(a0) OP(a1) OP(a2) OP(a3) OP(a4) OP(a5) OP(a6) OP(a7) OP(a8) OP(a9) OP(a10) OP(a11)

constexpr long kRounds = 100000000;

__attribute__((target("avx2,fma"))) int ymm_fma() {
  int sink = 0;
  __m256 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
#define ZEROY(v) v = _mm256_setzero_ps();
  EACH(ZEROY)
  const __m256 w = _mm256_set1_ps(1.0001f), x = _mm256_set1_ps(0.9999f);
  const auto start = std::chrono::steady_clock::now();
#define FMAY(v) asm volatile("vfmadd231ps %2, %1, %0" : "+x"(v) : "x"(w), "x"(x));
  for (long i = 0; i < kRounds; ++i) { EACH(FMAY) }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("vfmadd231ps ymm: %.2f G/s, %.0f GFLOPS\n", kRounds * 12 / s / 1e9, kRounds * 12 * 16 / s / 1e9);
  float lanes[8];
#define SUMY(v) _mm256_storeu_ps(lanes, v); sink += static_cast<int>(lanes[0]);
  EACH(SUMY)
  return sink;
}

__attribute__((target("avx512f,avx512vnni,avx512bw"))) int main() {
  int sink = ymm_fma();
  {
    __m512i a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
#define ZERO(v) v = _mm512_setzero_si512();
    EACH(ZERO)
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    const auto start = std::chrono::steady_clock::now();
#define DOT(v) asm volatile("vpdpbusd %2, %1, %0" : "+v"(v) : "v"(w), "v"(x));
    for (long i = 0; i < kRounds; ++i) { EACH(DOT) }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("vpdpbusd zmm: %.2f G/s, %.0f G int8 multiply-adds/s\n", kRounds * 12 / s / 1e9,
                kRounds * 12 * 64 / s / 1e9);
#define SUM(v) sink += _mm512_reduce_add_epi32(v);
    EACH(SUM)
  }
  {
    __m512 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
#define ZEROF(v) v = _mm512_setzero_ps();
    EACH(ZEROF)
    const __m512 w = _mm512_set1_ps(1.0001f), x = _mm512_set1_ps(0.9999f);
    const auto start = std::chrono::steady_clock::now();
#define FMA(v) asm volatile("vfmadd231ps %2, %1, %0" : "+v"(v) : "v"(w), "v"(x));
    for (long i = 0; i < kRounds; ++i) { EACH(FMA) }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("vfmadd231ps zmm: %.2f G/s, %.0f GFLOPS\n", kRounds * 12 / s / 1e9, kRounds * 12 * 32 / s / 1e9);
#define SUMF(v) sink += static_cast<int>(_mm512_reduce_add_ps(v));
    EACH(SUMF)
  }
  return sink == 42;
}
