# Streaming (540 MB of distinct weights) against hot (one layer's weights reused 30 times) at M rows:
# how much of the memory time the compute hides.
import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
torch.manual_seed(0)
isa = sys.argv[1] if len(sys.argv) > 1 else "avx512_bf16"
ops.cpu_isa(isa)
layer = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
cold = [torch.randn(n, k) * 0.02 for _ in range(30) for n, k in layer] + [torch.randn(49152, 576) * 0.02]
one = [torch.randn(n, k) * 0.02 for n, k in layer]
head_parts = [torch.randn(3072, 576) * 0.02 for _ in range(1)]
hot = one * 30 + head_parts * 16
Ms = [1, 8, 16]
xs = {(m, k): torch.randn(m, k) for m in Ms for k in (576, 1536)}
def run(ws, m):
    t = time.perf_counter()
    for w in ws: ops.small_batch_linear(xs[(m, w.shape[1])], w)
    return time.perf_counter() - t
res = {}
for r in range(8):
    for m in Ms:
        for name, ws in (("stream", cold), ("hot", hot)):
            dt = run(ws, m)
            if r > 1: res.setdefault((name, m), []).append(dt)
flop = lambda m: 2 * m * sum(w.numel() for w in cold)
print(isa, "threads", torch.get_num_threads())
for m in Ms:
    s, h = (statistics.median(res[(n, m)]) for n in ("stream", "hot"))
    print(f"M={m:2d}: stream {s*1e3:6.2f} ms ({flop(m)/s/1e9:5.1f} GFLOPS, {540e6/s/1e9:4.1f} GB/s)  hot {h*1e3:6.2f} ms ({flop(m)/h/1e9:5.1f} GFLOPS)")
