import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
ops.cpu_isa(sys.argv[1])
torch.manual_seed(0)
from bench.cost_curve import build_model
model = build_model("135m", "cpu", torch.float32)
weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
res = {}
with torch.inference_mode():
    for rnd in range(5):
        for t in [1, 8, 16]:
            xs = {w.shape[1]: torch.randn(t, w.shape[1]) for w in weights}
            for w in weights[:5]: ops.small_batch_linear(xs[w.shape[1]], w)
            s = time.perf_counter()
            for w in weights: ops.small_batch_linear(xs[w.shape[1]], w)
            res.setdefault(t, []).append((time.perf_counter() - s) * 1e3)
print(" ".join(f"M={t}: {statistics.median(v):.1f}" for t, v in res.items()))
