import sys, statistics, torch
sys.argv=[sys.argv[0]]+sys.argv[1:]
from bench.quantized_cost import one_token_ms
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from specdec_kernels import ops
target = load_model(weights="float32").model
runners = {"fp32-target": (ModelRunner(target), None)}
for hb in (4, 8):
    r = ModelRunner(quantized_copy(target, bits=4, group=32, head_bits=hb))
    runners[f"int4-h{hb}"] = (r, None); runners[f"int4-h{hb}-bf16kv"] = (r, torch.bfloat16)
for prefix in (256, 700):
    times = {n: [] for n in runners}
    with torch.inference_mode():
        for n, (r, kv) in runners.items(): one_token_ms(r, prefix, 3, kv_dtype=kv)
        for _ in range(4):
            for n, (r, kv) in runners.items(): times[n] += one_token_ms(r, prefix, 10, kv_dtype=kv)
    med = {n: statistics.median(t) for n, t in times.items()}
    print(ops.cpu_isa(), "prefix", prefix, "  ".join(f"{n} {v:.3f}ms ({v/med['fp32-target']:.3f})" for n, v in med.items()))
