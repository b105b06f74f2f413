"""Allocation or time: three allocations of the default model's decoding linears (540 MB each)
in one process, timed in turn (A, B, C, A, B, C, ...) at one row; per allocation the median
and every time, so a placement shows as a steady gap, a drift of the host as a shared one."""
import statistics
import sys
import time

import torch

from specdec_kernels import ops

shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
xs = {k: torch.randn(1, k) for k in (576, 1536)}
sets = [[torch.randn(n, k) * 0.02 for n, k in shapes] for _ in range(3)]
times = [[] for _ in sets]
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    for i, W in enumerate(sets):
        start = time.perf_counter()
        for w in W:
            ops.small_batch_linear(xs[w.shape[1]], w)
        times[i].append((time.perf_counter() - start) * 1e3)
for i, t in enumerate(times):
    print(f"allocation {'ABC'[i]}: median {statistics.median(t):.2f} ms | " + " ".join(f"{v:.1f}" for v in t))
