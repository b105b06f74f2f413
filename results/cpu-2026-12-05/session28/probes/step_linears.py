# The float32 decoding step's linears (30 layers of the default model's shapes, then the LM head),
# distinct weights (540 MB, streamed from memory), M rows; blocked-for-all on/off alternating in one process.
import os, sys, time, statistics, torch
from specdec_kernels import ops
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
W = [torch.randn(n, k) * 0.02 for n, k in shapes]
def step(M):
    xs = {k: torch.randn(M, k) for k in (576, 1536)}
    t = time.perf_counter()
    for w in W: ops.small_batch_linear(xs[w.shape[1]], w)
    return (time.perf_counter() - t) * 1e3
res = {}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for M in (1, 8, 16):
        for v in ("off", "on"):
            if v == "on": os.environ["SPECDEC_BLOCK_ALL"] = "1"
            else: os.environ.pop("SPECDEC_BLOCK_ALL", None)
            res.setdefault((M, v), []).append(step(M))
for M in (1, 8, 16):
    for v in ("off", "on"):
        xs = res[(M, v)]
        print(f"M={M:2d} {v:3s} median {statistics.median(xs):6.2f} ms  min {min(xs):6.2f}  (/M=1 {statistics.median(xs)/statistics.median(res[(1, v)]):.2f})")
