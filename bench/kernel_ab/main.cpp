// Usage: ab KIND LEVEL (KIND 0 = quantized, 1 = float; LEVEL 1 = AVX2, 2 = AVX-512): best of 12
// alternating runs per M, old and new.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "step.h"

int main(int argc, char** argv) {
  const auto kind = static_cast<ab::Kind>(argc > 1 ? std::atoi(argv[1]) : 0);
  const int level = argc > 2 ? std::atoi(argv[2]) : 2;
  ab::Step* versions[2] = {ab::make_old(kind), ab::make_new(kind)};
  for (int M : {1, 4, 8, 16}) {
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < 12; ++r)
      for (int v = 0; v < 2; ++v) best[v] = std::min(best[v], versions[v]->run(M, level));
    std::printf("%s level %d M=%2d old %.2f ms new %.2f ms new/old %.3f\n",
                kind == ab::kFloat ? "float" : "quantized", level, M, best[0], best[1], best[1] / best[0]);
  }
}
