"""Where the int4 quantized-self draft's one-token forward spends its time (default model,
prefix 256, bfloat16 K/V): torch profiler over 40 forwards."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import int4_draft, median_us

runner, cache, tokens, step = int4_draft()
with torch.inference_mode():
    print(f"one-token forward: median {median_us(step, 60, 10) / 1000:.2f} ms")
    with torch.profiler.profile() as prof:
        for _ in range(40):
            step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
