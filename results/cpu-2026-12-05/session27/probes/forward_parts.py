"""Where the int4 quantized-self draft's one-token forward spends its time outside
decoder_stack_ (default model, prefix 256, bfloat16 K/V): each piece timed alone by wrapping
it, medians over alternating rounds."""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../cpu-2026-12-04/session25/probes"))
import torch
from probe_lib import int4_draft, median_us, stack_arguments
from specdec_kernels.models import direct_forward as df
from specdec_kernels.decoding import runner as rn

runner, cache, tokens, step = int4_draft()
spent = {}

def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return out
    return wrapper

real_stack = torch.ops.specdec.decoder_stack_
with torch.inference_mode():
    args, kwargs = stack_arguments(runner, step)
    for name, owner, attr in (("stack", df.ops, "decoder_stack_"),
                              ("block_kwargs", rn, "block_forward_kwargs"),
                              ("stack_arguments", df.DirectForward, "stack_arguments"),
                              ("_logits(head)", df.DirectForward, "_logits"),
                              ("stacked(all)", df.DirectForward, "stacked")):
        setattr(owner, attr, timed(name, getattr(owner, attr)))
    n = 300
    for _ in range(20):
        step()
    spent.clear()
    t = time.perf_counter()
    for _ in range(n):
        step()
    total = time.perf_counter() - t
    print(f"forward {1e3 * total / n:.3f} ms")
    for k, v in spent.items():
        print(f"  {k}: {1e3 * v / n:.3f} ms")
