"""Probe: a float32 weight layout of panels (16 rows along the zmm lanes, K-major, one
contiguous stream a panel) against the package's row-layout small_batch_linear, on the default
model's decoding-step linears (30 layers + LM head, 540 MB), M = 1, 2, 4, 8, 16 rows,
interleaved in one process. Prints median ms per step and ratios.

Each output of the panel kernel is one FMA chain over k ascending from zero, whatever M and
the panel group: batch-invariant by construction (the bits differ from the row layout's).
"""
import os
import statistics
import sys
import time

import torch

from specdec_kernels import ops

SRC = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <chrono>
#include <vector>
#include <cstdlib>

// Lines fetched ahead in each panel stream (0: none), set by set_prefetch.
static int64_t g_ahead = 0;
static int g_hint = 1;  // 0: T0, 1: T1 (L2)
void set_prefetch(int64_t lines, int64_t hint) { g_ahead = lines; g_hint = hint; }
static inline void fetch(const float* p) {
  if (g_hint == 0) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  else _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
}

// x rows transposed to [K][M] so one k's broadcasts are one cache line.
template <int M, int G>
static void group_avx512(const float* xt, int64_t K, const float* w, int64_t stride,
                         float* out, int64_t ldo) {
  const int64_t ahead = g_ahead;
  __m512 acc[G][M];
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) acc[g][m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 wv[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_ps(w + g * stride + 16 * k);
    if (ahead != 0)
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) fetch(w + g * stride + 16 * (k + ahead));
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m512 xb = _mm512_set1_ps(xt[k * M + m]);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[g][m] = _mm512_fmadd_ps(wv[g], xb, acc[g][m]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + m * ldo + 16 * g, acc[g][m]);
}

template <int M, int G>
static void run_avx512(const float* xt, int64_t K, const float* w, int64_t panels, float* out,
                       int64_t N) {
  const int64_t stride = 16 * K;
  const int64_t groups = panels / G;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q)
      group_avx512<M, G>(xt, K, w + q * G * stride, stride, out + q * G * 16, N);
  });
  for (int64_t p = groups * G; p < panels; ++p)
    group_avx512<M, 1>(xt, K, w + p * stride, stride, out + p * 16, N);
}

// AVX2: 8-row halves of the same 16-row panels, G halves a group from half h0.
template <int M, int G>
static void group_avx2(const float* xt, int64_t ldxt, int64_t K, const float* w, int64_t h0,
                       float* out, int64_t ldo) {
  const int64_t ahead = g_ahead;
  const float* base[G];
  for (int g = 0; g < G; ++g) base[g] = w + ((h0 + g) / 2) * 16 * K + 8 * ((h0 + g) % 2);
  __m256 acc[G][M];
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) acc[g][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 wv[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) wv[g] = _mm256_loadu_ps(base[g] + 16 * k);
    if (ahead != 0)
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) if ((h0 + g) % 2 == 0 || g == 0) fetch(base[g] + 16 * (k + ahead));
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m256 xb = _mm256_broadcast_ss(xt + k * ldxt + m);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) acc[g][m] = _mm256_fmadd_ps(wv[g], xb, acc[g][m]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) _mm256_storeu_ps(out + m * ldo + 8 * (h0 + g), acc[g][m]);
}

// Rows in passes of MT over each group of G halves (the group's weights then come from L1/L2).
template <int MT, int G>
static void group_rows_avx2(const float* xt, int64_t M, int64_t K, const float* w, int64_t h0,
                            float* out, int64_t ldo) {
  int64_t m0 = 0;
  for (; m0 + MT <= M; m0 += MT) group_avx2<MT, G>(xt + m0, M, K, w, h0, out + m0 * ldo, ldo);
  switch (M - m0) {
    case 0: break;
    case 1: group_avx2<1, G>(xt + m0, M, K, w, h0, out + m0 * ldo, ldo); break;
    case 2: group_avx2<2, G>(xt + m0, M, K, w, h0, out + m0 * ldo, ldo); break;
    case 3: group_avx2<3, G>(xt + m0, M, K, w, h0, out + m0 * ldo, ldo); break;
    case 4: group_avx2<4, G>(xt + m0, M, K, w, h0, out + m0 * ldo, ldo); break;
    case 5: group_avx2<5, G>(xt + m0, M, K, w, h0, out + m0 * ldo, ldo); break;
    default: TORCH_CHECK(false, "rows left");
  }
}

template <int MT, int G>
static void run_avx2(const float* xt, int64_t M, int64_t K, const float* w, int64_t panels,
                     float* out, int64_t N) {
  const int64_t halves = 2 * panels, groups = halves / G;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) group_rows_avx2<MT, G>(xt, M, K, w, q * G, out, N);
  });
  for (int64_t h = groups * G; h < halves; ++h) group_rows_avx2<MT, 1>(xt, M, K, w, h, out, N);
}

at::Tensor pack(const at::Tensor& w) {  // [N, K] -> [N / 16, K, 16]
  const int64_t N = w.size(0), K = w.size(1);
  return w.view({N / 16, 16, K}).transpose(1, 2).contiguous();
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& wp, bool avx2) {
  const int64_t M = x.size(0), K = x.size(1), panels = wp.size(0), N = panels * 16;
  at::Tensor xt = x.t().contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  const float* xp = xt.data_ptr<float>();
  const float* w = wp.data_ptr<float>();
  float* o = out.data_ptr<float>();
  if (!avx2) {
    switch (M) {
      case 1: run_avx512<1, 8>(xp, K, w, panels, o, N); break;
      case 2: run_avx512<2, 8>(xp, K, w, panels, o, N); break;
      case 4: run_avx512<4, 4>(xp, K, w, panels, o, N); break;
      case 8: run_avx512<8, 2>(xp, K, w, panels, o, N); break;
      case 16: run_avx512<16, 1>(xp, K, w, panels, o, N); break;
      default: TORCH_CHECK(false, "M");
    }
  } else {
    static const int mt = std::getenv("PANEL_MT") ? std::atoi(std::getenv("PANEL_MT")) : 4;
    if (M == 1) run_avx2<1, 6>(xp, M, K, w, panels, o, N);
    else if (M == 2) run_avx2<2, 4>(xp, M, K, w, panels, o, N);
    else if (mt == 4) run_avx2<4, 3>(xp, M, K, w, panels, o, N);
    else if (mt == 6) run_avx2<6, 2>(xp, M, K, w, panels, o, N);
    else run_avx2<3, 4>(xp, M, K, w, panels, o, N);
  }
  return out;
}

// Seconds per pass of one thread's kernel over all panels of wp at M = 16, repeated in C++.
double time_m16(const at::Tensor& x, const at::Tensor& wp, int64_t reps) {
  const int64_t K = x.size(1), panels = wp.size(0), N = panels * 16;
  at::Tensor xt = x.t().contiguous();
  at::Tensor out = at::empty({16, N}, x.options());
  const auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r)
    for (int64_t p = 0; p < panels; ++p)
      group_avx512<16, 1>(xt.data_ptr<float>(), K, wp.data_ptr<float>() + p * 16 * K, 16 * K,
                          out.data_ptr<float>() + 16 * p, N);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
}

// GFLOPS of one thread's group kernel on G panels of K (in L1 for small G * K), repeated.
template <int M, int G>
double group_rate(int64_t K, int64_t reps) {
  std::vector<float> w(G * 16 * K, 0.01f), xt(K * M, 0.5f), out(M * 16 * G);
  for (int i = 0; i < 3; ++i) group_avx512<M, G>(xt.data(), K, w.data(), 16 * K, out.data(), 16 * G);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r)
    group_avx512<M, G>(xt.data(), K, w.data(), 16 * K, out.data(), 16 * G);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * M * G * 16 * K * reps / s / 1e9;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rate_16_1", &group_rate<16, 1>);
  m.def("rate_8_2", &group_rate<8, 2>);
  m.def("rate_4_4", &group_rate<4, 4>);
  m.def("rate_12_2", &group_rate<12, 2>);
  m.def("rate_8_3", &group_rate<8, 3>);
  m.def("rate_6_4", &group_rate<6, 4>);
  m.def("rate_24_1", &group_rate<24, 1>);
  m.def("time_m16", &time_m16);
  m.def("pack", &pack);
  m.def("set_prefetch", &set_prefetch);
  m.def("panel_linear", &panel_linear);
}
"""

def build():
    from torch.utils.cpp_extension import load
    path = "/tmp/float_panel_probe.cpp"
    with open(path, "w") as f:
        f.write(SRC)
    return load("float_panel_probe", [path], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"], verbose=False)


def main():
    avx2 = os.environ.get("SPECDEC_CPU_ISA") == "avx2"
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    ext = build()
    ext.set_prefetch(int(os.environ.get("PANEL_AHEAD", "64")), 0)
    torch.manual_seed(0)
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
    W = [torch.randn(n, k) * 0.02 for n, k in shapes]
    P = [ext.pack(w) for w in W]
    rows = (1, 2, 4, 8, 16)
    xs = {m: {k: torch.randn(m, k) for k in (576, 1536)} for m in rows}
    # correctness against float64, and batch invariance of the panel kernel
    for m in rows:
        for w, p in zip(W[:4], P[:4]):
            x = xs[m][w.shape[1]]
            got = ext.panel_linear(x, p, avx2)
            ref = (x.double() @ w.double().t()).float()
            assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (m, (got - ref).abs().max())
            one = torch.cat([ext.panel_linear(x[i:i + 1], p, avx2) for i in range(m)])
            assert torch.equal(one, got), m
    times = {(kind, m): [] for kind in ("rows", "panels") for m in rows}
    for _ in range(rounds):
        for m in rows:
            start = time.perf_counter()
            for w in W:
                ops.small_batch_linear(xs[m][w.shape[1]], w)
            times["rows", m].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            for p in P:
                ext.panel_linear(xs[m][p.shape[1]], p, avx2)
            times["panels", m].append((time.perf_counter() - start) * 1e3)
    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"isa {'avx2' if avx2 else 'avx512'} ops {ops.cpu_isa()} threads {torch.get_num_threads()} rounds {rounds}")
    print(" M   rows ms  rows/M1   panels ms  panels/M1  panels/rows")
    for m in rows:
        print(f"{m:2d}  {med['rows', m]:8.2f}  {med['rows', m] / med['rows', 1]:7.3f}  "
              f"{med['panels', m]:9.2f}  {med['panels', m] / med['panels', 1]:9.3f}  "
              f"{med['panels', m] / med['rows', m]:10.3f}")


if __name__ == "__main__":
    main()
