"""Per process: the float32 target's one-token forward (prefix 256), a plain read of a fresh
512 MB float32 tensor and a plain read of the model's own weights (torch sum, 2 threads), to
tell memory placement from compute."""
import statistics, time
import torch
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model

model = load_model(weights="float32").model
runner = ModelRunner(model)
big = torch.ones(128 * 1024 * 1024)
reads = []
for _ in range(8):
    s = time.perf_counter(); big.sum(); reads.append(512 / 1024 / (time.perf_counter() - s))
params = [p for p in model.parameters() if p.numel() > 1 << 16]
size = sum(p.numel() * 4 for p in params) / 2**30
weights = []
for _ in range(8):
    s = time.perf_counter()
    for p in params:
        p.sum()
    weights.append(size / (time.perf_counter() - s))
with torch.inference_mode():
    cache = runner.new_cache(1, 300)
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(256)]])
    t = []
    for _ in range(40):
        s = time.perf_counter(); runner.forward(cache, torch.tensor([[11]]), [256])
        t.append(1000 * (time.perf_counter() - s))
print(f"forward {statistics.median(t[5:]):.2f} ms | fresh 512 MB read {statistics.median(reads[2:]):.1f} GB/s"
      f" | the weights read {statistics.median(weights[2:]):.1f} GB/s")
