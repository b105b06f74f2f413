import torch, time, statistics, json
from specdec_kernels import ops
torch.manual_seed(0)
ws = [torch.randn(49152, 576) * 0.02 for _ in range(3)]  # 3 copies: stream from DRAM
out = {"isa": ops.cpu_isa()}
for m in (1, 6, 8, 12, 16):
    x = torch.randn(m, 576)
    for w in ws: ops.small_batch_linear(x, w)
    t = []
    for i in range(15):
        s = time.perf_counter(); ops.small_batch_linear(x, ws[i % 3]); t.append(time.perf_counter() - s)
    ms = 1000 * statistics.median(t)
    out[m] = (round(ms, 3), round(113.2 / ms, 1), round(2 * m * 28.3e6 / ms / 1e6, 1))
print(json.dumps(out))
