#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "cpu_rows.h"
using namespace specdec;
template <class F> double best_ns(F f, int reps = 300) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) { auto t = std::chrono::steady_clock::now(); f();
    best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count()); }
  return best;
}
int main() {
  const int64_t V = 151936;
  std::mt19937 g(0); std::normal_distribution<float> n(0, 3);
  std::vector<c10::BFloat16> x(V); for (auto& v : x) v = c10::BFloat16(n(g));
  std::vector<float> f(V), bm(V / 256 + 2);
  volatile double sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double a = best_ns([&] { auto s = rows::copy_scan_avx2(x.data(), f.data(), 0, V, bm.data()); sink = s.max; });
    double b = best_ns([&] { auto s = rows::copy_scan_avx512(x.data(), f.data(), 0, V, bm.data()); sink = s.max; });
    double c = best_ns([&] { auto s = rows::scan_avx2(x.data(), 0, V); sink = s.max; });
    double d = best_ns([&] { auto s = rows::scan_avx512(x.data(), 0, V); sink = s.max; });
    std::printf("ns/elem copy_scan avx2 %.3f avx512 %.3f | scan avx2 %.3f avx512 %.3f\n", a / V, b / V, c / V, d / V);
  }
}
