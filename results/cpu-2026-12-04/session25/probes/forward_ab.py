"""One-token forwards (prefix 256) of the int4 quantized-self draft (bfloat16 K/V, as the
drafter keeps it), the file-precision GGUF target and the float32 target: median ms of 60,
interleaved in one process; run alternately under two builds (forward_ab.sh)."""
import statistics, time
import torch
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model

target = load_model(weights="float32").model
runners = {
    "int4-draft": (ModelRunner(quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4)), True),
    "file-target": (ModelRunner(load_model(weights="file").model), False),
    "fp32-target": (ModelRunner(target), False),
}
tokens = torch.tensor([[11]])
times = {name: [] for name in runners}
with torch.inference_mode():
    caches = {}
    for name, (runner, narrow) in runners.items():
        cache = runner.new_cache(1, 300, runner.narrow_kv_dtype() if narrow else None)
        runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(256)]])
        caches[name] = cache
        for _ in range(5): runner.forward(cache, tokens, [256])
    for _ in range(3):
        for name, (runner, _) in runners.items():
            for _ in range(20):
                t = time.perf_counter(); runner.forward(caches[name], tokens, [256])
                times[name].append(time.perf_counter() - t)
print(" | ".join(f"{n}: {1e3*statistics.median(t):.3f}" for n, t in times.items()), flush=True)
