"""Float32 linears of 4 layers of the Qwen2.5-1.5B shape (qkv 1536->2048, o 1536->1536,
gate/up 1536->17920, down 8960->1536), distinct weights (840 MB streamed), M rows."""
import json, statistics, sys, time, torch
from specdec_kernels import ops
torch.manual_seed(0)
shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 4
weights = [torch.randn(n, k) * 0.02 for n, k in shapes]
macs = sum(n * k for n, k in shapes)
out = {"isa": ops.cpu_isa()}
for m in [int(x) for x in sys.argv[1].split(",")]:
    xs = {k: torch.randn(m, k) for k in (1536, 8960)}
    def run():
        for w in weights: ops.small_batch_linear(xs[w.shape[1]], w)
    run(); t = []
    for _ in range(5):
        s = time.perf_counter(); run(); t.append(time.perf_counter() - s)
    ms = 1000 * statistics.median(t)
    out[f"M={m}"] = {"ms": round(ms, 2), "GB/s": round(4 * macs / ms / 1e6, 1)}
print(json.dumps(out))
