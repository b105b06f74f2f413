"""Fixed cost a layer: one-token forwards of a 30-layer tiny Llama (hidden 64, 4/2 heads of 16,
float32, 64 cached rows), and its decoder_stack_ call alone; median of 400, 2 threads."""
import sys
sys.path.insert(0, "results/cpu-2026-12-04/session25/probes")
import torch
from probe_lib import median_us, stack_arguments
from python_tests.decoding_helpers import tiny_model
from specdec_kernels.decoding.runner import ModelRunner

model = tiny_model("llama", vocab=61, layers=30, hidden_size=64, intermediate_size=128,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
runner = ModelRunner(model, cpu_kernels=True)
with torch.inference_mode():
    cache = runner.new_cache(1, 128)
    runner.prefill(cache, [[(i * 7) % 61 for i in range(64)]])
    step = lambda: runner.forward(cache, torch.tensor([[5]]), [64])
    args, kwargs = stack_arguments(runner, step)
    stack = lambda: torch.ops.specdec.decoder_stack_(*args, **kwargs)
    print(f"forward {median_us(step):.0f} us, decoder_stack_ {median_us(stack):.0f} us "
          f"({median_us(stack) / 30:.1f} us a layer)")
    torch.set_num_threads(1)
    print(f"1 thread: forward {median_us(step):.0f} us, decoder_stack_ {median_us(stack):.0f} us "
          f"({median_us(stack) / 30:.1f} us a layer)")
