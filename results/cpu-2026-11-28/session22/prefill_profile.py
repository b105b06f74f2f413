import sys, time, torch, statistics
sys.path.insert(0, '/work/main')
torch.set_num_threads(2)
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
loaded = load_model(weights="float32")
t = ModelRunner(loaded.model)
P = int(sys.argv[1])
ids = [[(i * 7919) % 1000 + 10 for i in range(P)]]
from torch.profiler import profile, ProfilerActivity
with torch.inference_mode():
    for _ in range(2):
        cache = t.new_cache(1, P + 64); s = time.perf_counter(); t.prefill(cache, ids); print('prefill ms', (time.perf_counter() - s) * 1e3)
    cache = t.new_cache(1, P + 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t.prefill(cache, ids)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
a = torch.randn(768, 576); w = torch.randn(1536, 576)
for _ in range(3):
    s = time.perf_counter()
    for _ in range(20): torch.nn.functional.linear(a, w)
    dt = (time.perf_counter() - s) / 20
    print('torch linear 768x576x1536 GFLOPS', 2 * 768 * 576 * 1536 / dt / 1e9)
a = torch.randn(2048, 2048); 
for _ in range(3):
    s = time.perf_counter(); a @ a; dt = time.perf_counter() - s
    print('2048^3 GFLOPS', 2 * 2048**3 / dt / 1e9)
