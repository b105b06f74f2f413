import torch, time, statistics, json, os
from specdec_kernels import ops
torch.manual_seed(0)
out = {"isa": ops.cpu_isa()}
shapes = [tuple(map(int, s.split("x"))) for s in os.environ.get("SHAPES", "960x576,576x576,3072x576,576x1536").split(",")]
for n, k in shapes:
    ws = [torch.randn(n, k) * 0.02 for _ in range(30)]
    res = {}
    for m in (1, 8, 16):
        x = torch.randn(m, k)
        def run():
            for w in ws: ops.small_batch_linear(x, w)
        run()
        t = []
        for i in range(11):
            s = time.perf_counter(); run(); t.append(time.perf_counter() - s)
        ms = 1000 * statistics.median(t)
        res[m] = (round(ms, 3), round(30 * n * k * 4 / ms / 1e6, 1), round(2 * m * 30 * n * k / ms / 1e6, 1))
    out[f"{n}x{k}"] = res
print(json.dumps(out))
