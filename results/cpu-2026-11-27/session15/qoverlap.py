import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight
torch.manual_seed(0)
isa = sys.argv[1] if len(sys.argv) > 1 else "avx512_bf16"
ops.cpu_isa(isa)
layer = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
mk = lambda n, k: quantize_weight(torch.randn(n, k) * 0.02, 4, 32)
cold = [mk(n, k) for _ in range(30) for n, k in layer] + [mk(49152, 576)]
one = [mk(n, k) for n, k in layer]
hot = one * 30 + [mk(3072, 576)] * 16
nbytes = sum(q.qweight.numel() + 2 * q.scales.numel() * q.scales.element_size() for q in cold)
Ms = [1, 2, 4, 8]
xs = {(m, k): torch.randn(m, k) for m in Ms for k in (576, 1536)}
def run(ws, m):
    t = time.perf_counter()
    for q in ws: ops.quantized_linear(xs[(m, q.qweight.shape[1] * 2)], q.qweight, q.scales, q.mins)
    return time.perf_counter() - t
res = {}
for r in range(8):
    for m in Ms:
        for name, ws in (("stream", cold), ("hot", hot)):
            dt = run(ws, m)
            if r > 1: res.setdefault((name, m), []).append(dt)
print(isa, "threads", torch.get_num_threads(), f"{nbytes/1e6:.1f} MB")
for m in Ms:
    s, h = (statistics.median(res[(n, m)]) for n in ("stream", "hot"))
    print(f"M={m:2d}: stream {s*1e3:6.2f} ms ({nbytes/s/1e9:4.1f} GB/s)  hot {h*1e3:6.2f} ms")
