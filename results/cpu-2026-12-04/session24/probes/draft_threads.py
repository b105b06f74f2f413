import sys, time, torch
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
target = load_model(weights="float32").model
copy = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4)
rs = {"int4": ModelRunner(copy), "fp32": ModelRunner(target)}
prefix, steps = 256, 60
def run(runner, kv):
    cache = runner.new_cache(1, prefix + 3 + steps + 8, kv)
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    token = torch.tensor([[11]])
    def step():
        runner.forward(cache, token, list(cache.host_lens)); cache.extend([1])
    for _ in range(3): step()
    t = time.perf_counter()
    for _ in range(steps): step()
    return 1000 * (time.perf_counter() - t) / steps
with torch.inference_mode():
    for rnd in range(3):
        for th in (1, 2):
            torch.set_num_threads(th)
            out = {n: round(run(r, r.narrow_kv_dtype() if n == "int4" else None), 2) for n, r in rs.items()}
            print(rnd, "threads", th, out, flush=True)
