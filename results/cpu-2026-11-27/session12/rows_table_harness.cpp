#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "cpu_rows.h"
#include "unroll_proto.h"  // the 2x-unrolled variant tried (not kept): in this folder
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
  std::vector<float> f(V); for (auto& v : f) v = static_cast<float>(c10::BFloat16(n(g)));
  std::vector<float> tab(4096); rows::weight_table(40.f, 1.25f, tab.data());
  volatile double sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
  double t1 = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_avx2(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &s, nullptr); sink = s; } });
  double t2 = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_table2_avx2(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &s); sink = s; } });
  double t3 = best_ns([&] { double s; for (int64_t c = 0; c < V; c += 4096) { rows::exp_sum_avx512(f.data(), c, std::min(V, c + 4096), 40.f, 1.25f, 0.f, tab.data(), &s, nullptr); sink = s; } });
  double t4 = best_ns([&] { rows::weight_table_avx2(40.f, 1.25f, tab.data()); });
  double t5 = best_ns([&] { rows::weight_table_avx512(40.f, 1.25f, tab.data()); });
  std::printf("ns/elem avx2 table %.3f  unrolled %.3f  avx512 table %.3f | table build avx2 %.0f ns avx512 %.0f ns\n", t1 / V, t2 / V, t3 / V, t4, t5);
  }
}
