import time, torch
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
for w in ("file", "float32"):
    m = load_model(weights=w).model
    r = ModelRunner(m)
    for n in (128, 800):
        ts = []
        for _ in range(3):
            cache = r.new_cache(1, n + 8)
            t = time.perf_counter(); r.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(n)]]); ts.append(time.perf_counter() - t)
        print(w, n, "tokens prefill", round(min(ts), 3), "s", round(1000 * min(ts) / n, 2), "ms/token", flush=True)
