"""Engine step at T = 1, 4, 8, 16 against the same step's linears alone (every weight of the
model through ops.small_batch_linear at M = T), alternated, medians of 5 rounds."""
import sys, time, statistics
import torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
from bench.cost_curve import build_model, engine_step
ops.cpu_isa(sys.argv[1])
torch.manual_seed(0)
model = build_model("135m", "cpu", torch.float32)
weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
res = {}
with torch.inference_mode():
    engine, runner = engine_step(model, 512, 512 + 16)
    for rnd in range(5):
        for t in [1, 4, 8, 16]:
            new = torch.randint(model.config.vocab_size, (1, t))
            engine(new)
            s = time.perf_counter(); engine(new); e = time.perf_counter() - s
            xs = {w.shape[1]: torch.randn(t, w.shape[1]) for w in weights}
            s = time.perf_counter()
            for w in weights: ops.small_batch_linear(xs[w.shape[1]], w)
            l = time.perf_counter() - s
            res.setdefault(t, []).append((e * 1e3, l * 1e3))
for t, v in res.items():
    print(f"T={t:2d} step {statistics.median(x[0] for x in v):6.1f} ms  linears alone {statistics.median(x[1] for x in v):6.1f} ms")
print(len(weights), "linears")
