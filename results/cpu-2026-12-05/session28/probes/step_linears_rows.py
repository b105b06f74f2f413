"""The float32 decoding step's linears (the default model's 30 layers and LM head, distinct
weights, 540 MB streamed) at M = 1, 2, 3, 4, 8, 16 rows, interleaved in one process: median ms."""
import statistics
import sys
import time

import torch

from specdec_kernels import ops

torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
W = [torch.randn(n, k) * 0.02 for n, k in shapes]
rows = (1, 2, 3, 4, 8, 16)
xs = {m: {k: torch.randn(m, k) for k in (576, 1536)} for m in rows}
times = {m: [] for m in rows}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    for m in rows:
        start = time.perf_counter()
        for w in W:
            ops.small_batch_linear(xs[m][w.shape[1]], w)
        times[m].append((time.perf_counter() - start) * 1e3)
base = statistics.median(times[1])
for m in rows:
    med = statistics.median(times[m])
    print(f"M={m:2d} median {med:6.2f} ms  /M=1 {med / base:.3f}")
