"""The int4 quantized-self draft's one-token forward (default model, prefix 256, bfloat16 K/V)
split: the whole runner.forward and its decoder_stack_ call alone (the captured arguments),
at 2 and 1 threads, alternating rounds."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import int4_draft, median_us, stack_arguments

runner, cache, tokens, step = int4_draft()
with torch.inference_mode():
    args, kwargs = stack_arguments(runner, step)
    stack = lambda: torch.ops.specdec.decoder_stack_(*args, **kwargs)
    for _ in range(3):
        for threads in (2, 1):
            torch.set_num_threads(threads)
            print(f"threads {threads}: forward {median_us(step, 200, 10) / 1000:.3f} ms, "
                  f"decoder_stack_ alone {median_us(stack, 200, 10) / 1000:.3f} ms", flush=True)
