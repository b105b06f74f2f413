"""The float32 default model's decoding linears alone (30 layers: q/k/v joined 576->960, o
576->576, gate/up joined 576->3072, down 1536->576; LM head 576->49152), distinct weights as in
the step (540 MB streamed), small_batch_linear at M rows, 2 threads; median of rounds."""
import json, statistics, sys, time, torch
from specdec_kernels import ops
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
weights = [torch.randn(n, k) * 0.02 for n, k in shapes]
macs = sum(n * k for n, k in shapes)
out = {"isa": ops.cpu_isa(), "threads": torch.get_num_threads(), "weight_MB": round(4 * macs / 1e6)}
for m in [int(x) for x in sys.argv[1].split(",")]:
    xs = {k: torch.randn(m, k) for k in (576, 1536)}
    def run():
        for w in weights:
            ops.small_batch_linear(xs[w.shape[1]], w)
    run()
    t = []
    for _ in range(9):
        s = time.perf_counter(); run(); t.append(time.perf_counter() - s)
    ms = 1000 * statistics.median(t)
    out[f"M={m}"] = {"ms": round(ms, 2), "GFLOPS": round(2 * m * macs / ms / 1e6, 1),
                     "GB/s": round(4 * macs / ms / 1e6, 1)}
print(json.dumps(out))
