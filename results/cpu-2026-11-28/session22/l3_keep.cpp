#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
__attribute__((noinline)) float read_plain(const float* p, size_t n) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 32) { a = _mm512_add_ps(a, _mm512_load_ps(p + i)); b = _mm512_add_ps(b, _mm512_load_ps(p + i + 16)); }
  return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}
__attribute__((noinline)) float read_nt(const float* p, size_t n) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 32) {
    a = _mm512_add_ps(a, _mm512_castsi512_ps(_mm512_stream_load_si512((void*)(p + i))));
    b = _mm512_add_ps(b, _mm512_castsi512_ps(_mm512_stream_load_si512((void*)(p + i + 16)))); }
  return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}
template <int H>
__attribute__((noinline)) float read_pf(const float* p, size_t n) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 32) {
    _mm_prefetch((const char*)(p + i + 1024), (_mm_hint)H);
    _mm_prefetch((const char*)(p + i + 1024 + 16), (_mm_hint)H);
    a = _mm512_add_ps(a, _mm512_load_ps(p + i)); b = _mm512_add_ps(b, _mm512_load_ps(p + i + 16)); }
  return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}
int main(int argc, char** argv) {
  size_t na = size_t(atoi(argv[1])) << 20 >> 2, nb = size_t(atoi(argv[2])) << 20 >> 2;
  float* A = (float*)aligned_alloc(64, na * 4); float* B = (float*)aligned_alloc(64, nb * 4 + 8192);
  for (size_t i = 0; i < na; ++i) A[i] = 1; for (size_t i = 0; i < nb + 2048; ++i) B[i] = 1;
  const char* names[] = {"plain", "pf_t0", "pf_nta", "ntload"};
  for (int mode = 0; mode < 4; ++mode) {
    double ta = 0, tb = 0; float s = 0;
    for (int it = 0; it < 12; ++it) {
      double t0 = now(); s += read_plain(A, na); double t1 = now();
      if (mode == 0) s += read_plain(B, nb); else if (mode == 1) s += read_pf<_MM_HINT_T0>(B, nb); else if (mode == 2) s += read_pf<_MM_HINT_NTA>(B, nb); else s += read_nt(B, nb);
      double t2 = now();
      if (it >= 2) { ta += t1 - t0; tb += t2 - t1; }
    }
    printf("%-7s A %zu MB: %.1f GB/s   B %zu MB: %.1f GB/s  (%g)\n", names[mode], na * 4 >> 20, 10 * na * 4 / ta / 1e9, nb * 4 >> 20, 10 * nb * 4 / tb / 1e9, s);
  }
}
