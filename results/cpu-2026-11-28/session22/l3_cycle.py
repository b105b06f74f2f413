import sys, time, torch, statistics
sys.path.insert(0, '/work/main')
torch.set_num_threads(2)
from specdec_kernels.models.quantized_weight import quantize_weight, pack_panels
import torch.nn.functional as F
g = torch.Generator().manual_seed(0)
W = [pack_panels(quantize_weight(torch.randn(3072, 576, generator=g), 4, 32)) for _ in range(100)]
mb = sum(w.qweight.numel() + 2 * w.scales.numel() * 2 for w in W[:1]) / 1e6
x = torch.randn(1, 576)
for n in [10, 20, 30, 40, 60, 100]:
    ts = []
    for r in range(9):
        s = time.perf_counter()
        for w in W[:n]: F.linear(x, w)
        ts.append((time.perf_counter() - s) / n)
    t = statistics.median(ts)
    print(f"{n:3d} weights ({n*mb:5.1f} MB cycle): {t*1e6:6.1f} us/call  {mb/t/1e3:5.1f} GB/s")
