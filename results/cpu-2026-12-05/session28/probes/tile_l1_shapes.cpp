#include "cpu_dot.h"
#include <chrono>
#include <cstdio>
#include <vector>
using namespace specdec;
int main(int argc, char** argv) {
  int level = argc > 1 ? atoi(argv[1]) : 2;
  const dot::TileTable& t = dot::tiles_for<float>(level);
  for (int K : {576}) for (int MR = 1; MR <= t.row_tile; ++MR) for (int NR = 1; NR <= t.weight_tile; ++NR) {
    std::vector<float> x(MR * K, 0.5f), w(NR * K, 0.25f), out(MR * NR);
    long reps = 200000000L / (MR * NR * K);
    auto s = std::chrono::steady_clock::now();
    for (long r = 0; r < reps; ++r) t.table[MR - 1][NR - 1](x.data(), K, w.data(), K, K, nullptr, out.data(), NR, nullptr, 0);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    printf("%5.0f%s", 2.0 * MR * NR * K * reps / dt / 1e9, NR == t.weight_tile ? "\n" : " ");
  }
}
