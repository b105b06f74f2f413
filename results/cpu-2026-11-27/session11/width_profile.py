"""Target forward at width W (a chain/tree of W tokens) after a prefix: per-op times."""
import sys, time, torch
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
prefix = int(sys.argv[1]) if len(sys.argv) > 1 else 600
model = load_model("default", weights="float32").model
runner = ModelRunner(model)
steps = 12
cache = runner.new_cache(1, prefix + 64)
res = {}
with torch.inference_mode():
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    for W in [1, 4, 8, 1, 4, 8]:
        tokens = torch.tensor([[11 + i for i in range(W)]])
        parents = torch.tensor([[-1] + [0] * (W - 1)]) if W > 1 else None  # depth-1 siblings
        def step():
            runner.forward(cache, tokens, list(cache.host_lens), parents)
        for _ in range(3): step()
        t = time.perf_counter()
        for _ in range(steps): step()
        plain = (time.perf_counter() - t) / steps * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps): step()
        ops = {e.key: e.self_cpu_time_total / 1000 / steps for e in prof.key_averages()}
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:8]
        print(f"W={W} prefix {prefix}: {plain:.2f} ms;", ", ".join(f"{k} {v:.2f}" for k, v in top))
