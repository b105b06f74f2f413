"""The decoding step's linears (float32: the default model's 30 layers + LM head, 540 MB;
int4 panels of the same shapes, group 32) at M = 1, 2, 4, 8, 16 rows, with the work over
threads by static halves (at::parallel_for) or claimed in chunks (SPECDEC_AB_CLAIM, a
switch of the probed build only), interleaved in one process: median ms and claim/static."""
import os
import statistics
import sys
import time

import torch

from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import pack_panels, quantize_weight

torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
W = [torch.randn(n, k) * 0.02 for n, k in shapes]
rows = (1, 2, 4, 8, 16)
xs = {m: {k: torch.randn(m, k) for k in (576, 1536)} for m in rows}
kind = sys.argv[2] if len(sys.argv) > 2 else "float"
if kind == "int4":
    Q = [pack_panels(quantize_weight(w, bits=4, group=32)) for w in W]

def run(m):
    if kind == "float":
        for w in W:
            ops.small_batch_linear(xs[m][w.shape[1]], w)
    else:
        for w, q in zip(W, Q):
            q.linear(xs[m][w.shape[1]])

times = {(c, m): [] for c in (0, 1) for m in rows}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    for m in rows:
        for c in ((0, 1) if r % 2 == 0 else (1, 0)):
            if c:
                os.environ["SPECDEC_AB_CLAIM"] = "1"
            else:
                os.environ.pop("SPECDEC_AB_CLAIM", None)
            start = time.perf_counter()
            run(m)
            times[c, m].append((time.perf_counter() - start) * 1e3)
print(f"{kind} isa {ops.cpu_isa()} threads {torch.get_num_threads()}")
for m in rows:
    a, b = statistics.median(times[0, m]), statistics.median(times[1, m])
    print(f"M={m:2d} static {a:7.2f} ms  claim {b:7.2f} ms  claim/static {b / a:.3f}")
