"""The int4 draft's decoder_stack_ call (its captured arguments) in a loop for 12 s, for
`perf record -p PID` once /tmp/ready exists."""
import os, sys, time
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import int4_draft, stack_arguments

runner, cache, tokens, step = int4_draft()
with torch.inference_mode():
    args, kwargs = stack_arguments(runner, step)
    for _ in range(20):
        torch.ops.specdec.decoder_stack_(*args, **kwargs)
    open("/tmp/ready", "w").write("1")
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 12:
        torch.ops.specdec.decoder_stack_(*args, **kwargs)
        n += 1
    print(f"{1e3 * 12 / n:.2f} ms a stack")
