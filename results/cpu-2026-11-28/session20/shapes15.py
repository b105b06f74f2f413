"""Per shape, the 1.5b float32 linears (8 copies each, streamed), M = 1, 8, 16."""
import torch, time, statistics, json
from specdec_kernels import ops
torch.manual_seed(0)
out = {"isa": ops.cpu_isa()}
import os
SH = [tuple(map(int, s.split("x"))) for s in os.environ.get("SHAPES", "2048x1536,1536x1536,17920x1536,1536x8960").split(",")]
for n, k in SH:
    copies = max(2, int(400e6 / (n * k * 4)))
    ws = [torch.randn(n, k) * 0.02 for _ in range(copies)]
    res = {}
    for m in (1, 8, 16):
        x = torch.randn(m, k)
        def run():
            for w in ws: ops.small_batch_linear(x, w)
        run(); t = []
        for i in range(7):
            s = time.perf_counter(); run(); t.append(time.perf_counter() - s)
        ms = 1000 * statistics.median(t) / copies
        res[m] = (round(ms, 3), round(n * k * 4 / ms / 1e6, 1), round(2 * m * n * k / ms / 1e6, 1))
    out[f"{n}x{k}"] = res
print(json.dumps(out))
