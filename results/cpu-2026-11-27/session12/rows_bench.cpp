#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <cstring>
#include "cpu_rows.h"
#include "table_proto.h"
using namespace specdec;
template <class F> double best_ns(F f, int reps = 200) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t = std::chrono::steady_clock::now(); f();
    best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}
int main() {
  const int64_t V = 151936;
  std::mt19937 g(0); std::normal_distribution<float> n(0, 3);
  std::vector<c10::BFloat16> x(V); std::vector<float> f(V), bm(V / 256 + 2);
  for (auto& v : x) v = c10::BFloat16(n(g));
  x[1234] = c10::BFloat16(40.f);
  volatile double sink = 0;
  double t_scan = best_ns([&] { auto s = rows::scan_avx512(x.data(), 0, V); sink = s.max; });
  double t_copy = best_ns([&] { auto s = rows::copy_scan_avx512(x.data(), f.data(), 0, V, bm.data()); sink = s.max; });
  double t_exp = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_avx512(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, &s, nullptr); sink = s; } });
  double t_exp2 = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_avx2(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, &s, nullptr); sink = s; } });
  double t_scan2 = best_ns([&] { auto s = rows::scan_avx2(x.data(), 0, V); sink = s.max; });
  double t_copy2 = best_ns([&] { auto s = rows::copy_scan_avx2(x.data(), f.data(), 0, V, bm.data()); sink = s.max; });
  std::vector<float> tab(4096);
  double t_build = best_ns([&] { rows::build_table(40.f, 1.25f, tab.data()); });
  double t_t512 = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_table_avx512(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &s); sink = s; } });
  double t_t2 = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_table_avx2(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &s); sink = s; } });
  // check equality
  for (int64_t c = 0; c < V; c += 4096) { double a, b, e; rows::exp_sum_avx512(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, &a, nullptr); rows::exp_sum_table_avx512(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &b); rows::exp_sum_table_avx2(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &e); double a2; rows::exp_sum_avx2(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, &a2, nullptr); if (a != b || a2 != e) std::printf("MISMATCH %ld %.17g %.17g %.17g %.17g\n", c, a, b, a2, e); }
  std::printf("table build %.0f ns; table exp_sum ns/elem avx512 %.3f avx2 %.3f\n", t_build, t_t512 / V, t_t2 / V);
  std::printf("ns/elem  avx512: scan %.3f copy_scan %.3f exp_sum %.3f | avx2: scan %.3f copy_scan %.3f exp_sum %.3f\n",
              t_scan / V, t_copy / V, t_exp / V, t_scan2 / V, t_copy2 / V, t_exp2 / V);
}
