import time, torch, statistics, os, sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from arena_lib import relocate
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
a = load_model(weights="file").model
b = load_model(weights="file").model
raw = relocate(b)
prefix = 256
def runner_time(runner, steps=40):
    cache = runner.new_cache(1, prefix + steps + 8)
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    token = torch.tensor([[11]])
    for _ in range(2):
        runner.forward(cache, token, list(cache.host_lens)); cache.extend([1])
    ts = []
    for _ in range(steps - 4):
        t = time.perf_counter(); runner.forward(cache, token, list(cache.host_lens)); cache.extend([1]); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000
ra, rb = ModelRunner(a), ModelRunner(b)
with torch.inference_mode():
    x = torch.tensor([[1, 2, 3, 4, 5]])
    res = {"separate": [], "arena huge": []}
    for r in range(int(os.environ.get("ROUNDS", "10"))):
        res["separate"].append(runner_time(ra)); res["arena huge"].append(runner_time(rb))
for k, v in res.items(): print(k, [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
