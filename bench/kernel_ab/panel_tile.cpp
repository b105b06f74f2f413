// One thread, one int4 panel weight (csrc/cpu_qpanel.h, scales and mins in float32): the
// tiles' multiply-add rate at M = 1..16 rows with the weight resident (one copy, in L2) and
// streaming (COPIES copies, past the last-level cache). Read it against
// bench/kernel_ab/vector_peak.cpp's vpdpbusd rate: the share of the core the tile uses, apart
// from the threads, the row quantization and the calls of the whole op.
//
//   g++ -O3 -std=c++17 -ffp-contract=off -I$(python3 -c "import torch.utils.cpp_extension
//     as c; print(c.include_paths()[0])") -Icsrc bench/kernel_ab/panel_tile.cpp -o /tmp/ptile
//   /tmp/ptile [N K COPIES LEVEL]     (default 1536 576 100 2)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu_qpanel.h"

using namespace specdec;
using namespace specdec::qpanel;

namespace {

// Seconds per pass of M rows over `weights` (each [N / 16] panels), best of 20.
double pass_seconds(const std::vector<PanelWeights<float>>& weights, int64_t N, const PanelRows& x,
                    const PanelTiles<float>& tiles, std::vector<float>& out) {
  const int64_t M = x.rows, row_tiles = (M + tiles.rows - 1) / tiles.rows;
  double best = 1e9;
  for (int round = 0; round < 20; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (const auto& w : weights)
      for (int64_t p = 0; p < N / kPanelRows; ++p) {
        int64_t m0 = 0;
        for (int64_t r = 0; r < row_tiles; ++r) {
          const int mr = static_cast<int>(M / row_tiles + (r < M % row_tiles ? 1 : 0));
          tiles.table[mr - 1](x, m0, w, p, out.data() + m0 * N + p * kPanelRows, N);
          m0 += mr;
        }
      }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best / weights.size();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoi(argv[1]) : 1536, K = argc > 2 ? std::atoi(argv[2]) : 576;
  const int copies = argc > 3 ? std::atoi(argv[3]) : 100, level = argc > 4 ? std::atoi(argv[4]) : 2;
  const int64_t blocks = K / kBlock;
  std::mt19937 rng(0);
  std::vector<uint8_t> q(copies * N * K / 2);
  std::vector<float> scale(copies * N * blocks), min(copies * N * blocks);
  for (auto& v : q) v = static_cast<uint8_t>(rng());
  for (auto& v : scale) v = 0.0001f * (rng() % 100 + 1);
  for (auto& v : min) v = -0.0008f * (rng() % 100 + 1);
  std::vector<PanelWeights<float>> all;
  for (int c = 0; c < copies; ++c)
    all.push_back({q.data() + c * N * K / 2, scale.data() + c * N * blocks, min.data() + c * N * blocks, blocks});
  const std::vector<PanelWeights<float>> one(all.begin(), all.begin() + 1);
  const auto& tiles = tiles_for<float, true>(level);
  std::printf("int4 panels [%ld, %ld], %d copies (%.1f MB), level %d, one thread\n", static_cast<long>(N),
              static_cast<long>(K), copies, copies * N * (K / 2 + 8.0 * blocks) / 1e6, level);
  for (int M : {1, 2, 4, 8, 16}) {
    std::vector<float> x(M * K), out(M * N);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 50.0f;
    const PanelRows rows = quantize_rows(x.data(), M, K, level);
    const double resident = pass_seconds(one, N, rows, tiles, out);
    const double streaming = pass_seconds(all, N, rows, tiles, out);
    const double macs = static_cast<double>(M) * N * K;
    std::printf("M=%2d resident %6.1f us %4.0f G multiply-adds/s | streaming %6.1f us %4.0f G/s\n", M,
                resident * 1e6, macs / resident / 1e9, streaming * 1e6, macs / streaming / 1e9);
  }
}
