import json, statistics, sys, time, torch
from specdec_kernels import ops
torch.manual_seed(0)
shapes = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 4
weights = [(torch.randn(n, k) * 0.02).bfloat16() for n, k in shapes]
out = {"isa": ops.cpu_isa()}
for m in (1, 8, 16):
    xs = {k: torch.randn(m, k).bfloat16() for k in (1536, 8960)}
    def run():
        for w in weights: ops.small_batch_linear(xs[w.shape[1]], w)
    run(); t = []
    for _ in range(7):
        s = time.perf_counter(); run(); t.append(time.perf_counter() - s)
    out[f"M={m}"] = round(1000 * statistics.median(t), 2)
print(json.dumps(out))
