"""File-precision step costs of the synthetic Qwen2.5-1.5B / 0.5B shapes (Q4_K_M mix): c(T) of the
target, one draft token of the 0.5B, interleaved rounds, medians (prefix 512)."""
import json, statistics, sys, torch
from bench.quantized_cost import one_token_ms
from specdec_kernels import ops
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
target = ModelRunner(load_model("/tmp/s19/qwen15b-shape.gguf", weights="file").model)
draft = ModelRunner(load_model("/tmp/s19/qwen05b-shape.gguf", weights="file").model)
prefix = 512
cases = {f"target T={t}": (target, t) for t in (1, 2, 4, 5, 6, 8)}
cases["draft T=1"] = (draft, 1)
times = {k: [] for k in cases}
with torch.inference_mode():
    for k, (r, t) in cases.items(): one_token_ms(r, prefix, 2, width=t)
    for _ in range(3):
        for k, (r, t) in cases.items(): times[k] += one_token_ms(r, prefix, 5, width=t)
med = {k: round(statistics.median(v), 2) for k, v in times.items()}
c1 = med["target T=1"]
out = {"isa": ops.cpu_isa(), "prefix": prefix, "ms": med, "c(T)/c(1)": {k: round(v / c1, 3) for k, v in med.items()}}
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
