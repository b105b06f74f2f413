// The int4 linears of one decoding step of the default model (30 layers of q/k/v, o,
// gate/up, down: ~80 MB with scales and mins, past the last-level cache), then its int8 LM
// head (49152 x 576, 30 MB), in the row layout
// (csrc/cpu_qdot.h) against the panel layout (csrc/cpu_qpanel.h), alternating call by call,
// 2 threads, at M = 1..16 rows; both on the best instruction set this CPU has (level 2 =
// AVX-512, or pass 1 for AVX2). Also prints the largest difference between the two layouts'
// outputs (they sum in other orders; relative to the output's scale).
//
// The row layout puts K along the vector lanes: every output pays a float conversion, a
// scale product and an FMA per 128 values, and a horizontal reduction. The panel layout puts
// 16 weight rows along the lanes: one vpdpbusd advances 16 outputs, and the float work is a
// quarter of that.
//
//   g++ -O3 -std=c++17 -fopenmp -ffp-contract=off -I$(python3 -c "import torch.utils.cpp_extension
//     as c; print(c.include_paths()[0])") -Icsrc bench/kernel_ab/packed_int4.cpp -o /tmp/packed
//   /tmp/packed [LEVEL]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_qdot.h"
#include "cpu_qpanel.h"

using namespace specdec;

namespace {

constexpr int kPanel = qpanel::kPanelRows;
constexpr int kBlock = qpanel::kBlock;
int level = 2;

// One linear in both formats: the row layout (int4 [N, K/2] bytes or int8 [N, K], per-group
// scale and min) and the panel one ([N/16][K/32][256 or 512 bytes], scales and mins
// [N/16][K/32][16]). int8 weights (the LM head, Q8_0 in the default model's file) have no mins.
struct Weight {
  int64_t N, K;
  bool int4;
  std::vector<uint8_t> q;          // today's layout
  std::vector<float> scale, min;   // [N, K/32]
  std::vector<uint8_t> packed;     // the panel layout
  std::vector<float> pscale, pmin; // [N/16, K/32, 16]
};

Weight make_weight(int64_t N, int64_t K, bool int4, std::mt19937& rng) {
  const int64_t row_bytes = int4 ? K / 2 : K, block_bytes = qpanel::block_bytes(int4);
  Weight w{N, K, int4, std::vector<uint8_t>(N * row_bytes), {}, {}, {}, {}, {}};
  std::uniform_real_distribution<float> u(0.001f, 0.02f);
  for (auto& v : w.q) v = static_cast<uint8_t>(rng());
  const int64_t blocks = K / kBlock;
  w.scale.resize(N * blocks);
  if (int4) w.min.resize(N * blocks);
  for (auto& v : w.scale) v = u(rng);
  for (auto& v : w.min) v = -8.0f * u(rng);
  // Block b of a row holds block_bytes / 16 bytes; packed vector j of (panel, block) holds, in
  // lane r, bytes 4j..4j+3 of row 16 * panel + r's block.
  w.packed.resize(N * row_bytes);
  w.pscale.resize(N * blocks);
  if (int4) w.pmin.resize(N * blocks);
  for (int64_t p = 0; p < N / kPanel; ++p)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* dst = w.packed.data() + (p * blocks + b) * block_bytes;
      for (int j = 0; j < block_bytes / 64; ++j)
        for (int r = 0; r < kPanel; ++r)
          std::memcpy(dst + 64 * j + 4 * r,
                      w.q.data() + (p * kPanel + r) * row_bytes + b * (block_bytes / 16) + 4 * j, 4);
      for (int r = 0; r < kPanel; ++r) {
        w.pscale[(p * blocks + b) * kPanel + r] = w.scale[(p * kPanel + r) * blocks + b];
        if (int4) w.pmin[(p * blocks + b) * kPanel + r] = w.min[(p * kPanel + r) * blocks + b];
      }
    }
  return w;
}

struct Step {
  std::vector<Weight> weights;
  // int4: the 30 layers' linears; int8: the LM head.
  explicit Step(bool int4) {
    std::mt19937 rng(0);
    if (!int4) {
      weights.push_back(make_weight(49152, 576, false, rng));
      return;
    }
    for (int layer = 0; layer < 30; ++layer) {
      weights.push_back(make_weight(960, 576, true, rng));
      weights.push_back(make_weight(576, 576, true, rng));
      weights.push_back(make_weight(3072, 576, true, rng));
      weights.push_back(make_weight(576, 1536, true, rng));
    }
  }

  // Today's tiles, as csrc/quantized_linear.cpp calls them. Returns ms.
  double run_today(const std::vector<float>& x, int M, std::vector<std::vector<float>>* outs) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < weights.size(); ++i) {
      const Weight& w = weights[i];
      std::vector<float>& out = (*outs)[i];
      const auto xq = qdot::quantize_rows(x.data(), M, w.K, 32, w.int4, level);
      const qdot::QuantizedWeights<float> qw{w.q.data(), w.scale.data(), w.int4 ? w.min.data() : nullptr,
                                             w.int4 ? w.K / 2 : w.K, w.K / 32, 32};
      const auto& tiles = w.int4 ? qdot::qtiles_for<float, true>(level) : qdot::qtiles_for<float, false>(level);
      const int wt = M == 1 ? qdot::kSingleRowWeightTile : qdot::kWeightTile;
      const int64_t count = (w.N + wt - 1) / wt;
#pragma omp parallel for num_threads(2) schedule(static)
      for (int64_t t = 0; t < count; ++t) {
        const int64_t n0 = t * wt;
        const int nr = static_cast<int>(std::min<int64_t>(wt, w.N - n0));
        if (M == 1) {
          tiles.single[nr - 1](xq, 0, qw, n0, out.data() + n0, w.N);
          continue;
        }
        for (int64_t m0 = 0; m0 < M; m0 += qdot::kMaxRowTile) {
          const int mr = static_cast<int>(std::min<int64_t>(qdot::kMaxRowTile, M - m0));
          tiles.table[mr - 1][nr - 1](xq, m0, qw, n0, out.data() + m0 * w.N + n0, w.N);
        }
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
  }

  double run_packed(const std::vector<float>& x, int M, std::vector<std::vector<float>>* outs) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < weights.size(); ++i) {
      const Weight& w = weights[i];
      std::vector<float>& out = (*outs)[i];
      const auto& tiles = w.int4 ? qpanel::tiles_for<float, true>(level) : qpanel::tiles_for<float, false>(level);
      const qpanel::PanelRows xq = qpanel::quantize_rows(x.data(), M, w.K, level);
      const qpanel::PanelWeights<float> pw{w.packed.data(), w.pscale.data(), w.int4 ? w.pmin.data() : nullptr,
                                           w.K / kBlock};
      const int64_t panels = w.N / kPanel;
      const int64_t row_tiles = (M + tiles.rows - 1) / tiles.rows;
#pragma omp parallel for num_threads(2) schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        int64_t m0 = 0;
        for (int64_t r = 0; r < row_tiles; ++r) {
          const int mr = static_cast<int>(M / row_tiles + (r < M % row_tiles ? 1 : 0));
          tiles.table[mr - 1](xq, m0, pw, p, out.data() + m0 * w.N + p * kPanel, w.N);
          m0 += mr;
        }
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
  }
};

}  // namespace

int main(int argc, char** argv) {
  level = argc > 1 ? std::atoi(argv[1]) : 2;
  for (bool int4 : {true, false}) {
  Step step(int4);
  double bytes = 0;
  for (const auto& w : step.weights) bytes += w.q.size() + 4.0 * (w.scale.size() + w.min.size());
  std::printf("%s: %.1f MB (values, scales, mins), level %d\n",
              int4 ? "int4 linears of one step" : "int8 LM head", bytes / 1e6, level);
  for (int M : {1, 2, 4, 8, 16}) {
    std::vector<float> x(M * 1536);
    for (int i = 0; i < M * 1536; ++i) x[i] = static_cast<float>((i * 7919) % 200 - 100) / 100.0f;
    std::vector<std::vector<float>> today(step.weights.size()), packed(step.weights.size());
    for (size_t i = 0; i < step.weights.size(); ++i) {
      today[i].assign(M * step.weights[i].N, 0.0f);
      packed[i].assign(M * step.weights[i].N, 0.0f);
    }
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < 12; ++r) {
      best[0] = std::min(best[0], step.run_today(x, M, &today));
      best[1] = std::min(best[1], step.run_packed(x, M, &packed));
    }
    // The two formats sum in different orders: their outputs agree to float rounding.
    double worst = 0;
    for (size_t i = 0; i < step.weights.size(); ++i) {
      double scale = 0;
      for (float v : today[i]) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      for (size_t j = 0; j < today[i].size(); ++j)
        worst = std::max(worst, std::fabs(static_cast<double>(today[i][j]) - packed[i][j]) / scale);
    }
    std::printf("M=%2d today %.2f ms packed %.2f ms packed/today %.3f  max |diff|/max|out| %.1e\n", M,
                best[0], best[1], best[1] / best[0], worst);
  }
  }
}
