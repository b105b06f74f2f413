"""How much of a decoding step fusion removes: HF generate on the default model (float32, torch's
kernels), static cache, eager against ``torch.compile`` of the forward (inductor, CPU).

    python3 bench/compile_probe.py
"""
import time

import torch

from specdec_kernels.models import load_default_model

model = load_default_model(dtype=torch.float32, weights="float32").model
prompt = torch.tensor([[(i * 7919) % 1000 + 10 for i in range(200)]])
new = 64
def run(label):
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static", pad_token_id=0)
    t = time.perf_counter(); model.generate(prompt, **kw); first = time.perf_counter() - t
    times = []
    for _ in range(3):
        t = time.perf_counter(); model.generate(prompt, **kw); times.append(time.perf_counter() - t)
    times.sort()
    # per-token decode: subtract a 1-token generate (prefill) time
    t = time.perf_counter(); model.generate(prompt, **{**kw, "max_new_tokens": 1, "min_new_tokens": 1}); pre = time.perf_counter() - t
    print(f"{label}: first call {first:.1f} s; {new} tokens {times[1]:.3f} s; prefill {pre:.3f} s; "
          f"decode {(times[1]-pre)/(new-1)*1e3:.2f} ms/token", flush=True)
with torch.inference_mode():
    run("eager")
    model.forward = torch.compile(model.forward, dynamic=None)
    run("compiled")
