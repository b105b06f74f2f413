"""Whether the float32 step's speed mode follows the process or the allocation: the default
model's decoding linears (540 MB, distinct weights) at one row, re-allocated several times in one
process, each allocation timed 7 times (median)."""
import statistics
import sys
import time

import torch

from specdec_kernels import ops

shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
xs = {k: torch.randn(1, k) for k in (576, 1536)}
for alloc in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    W = [torch.randn(n, k) * 0.02 for n, k in shapes]
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for w in W:
            ops.small_batch_linear(xs[w.shape[1]], w)
        times.append((time.perf_counter() - start) * 1e3)
    print(f"allocation {alloc}: median {statistics.median(times):.2f} ms, min {min(times):.2f}", flush=True)
    del W
