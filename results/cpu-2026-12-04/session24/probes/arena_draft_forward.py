"""The int4 draft's one-token forward: its quantized weights in their own allocations against
the same weights moved into one huge-page buffer, alternating (ROUNDS=12 env)."""
import os, statistics, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import one_token_ms, relocate
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model

target = load_model(weights="float32").model
a = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4)
b = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=5)  # a distinct copy object
b_raw = relocate(b, huge=True)
ra, rb = ModelRunner(a), ModelRunner(b)
with torch.inference_mode():
    res = {"separate": [], "arena huge": []}
    for _ in range(int(os.environ.get("ROUNDS", "8"))):
        res["separate"].append(one_token_ms(ra, ra.narrow_kv_dtype()))
        res["arena huge"].append(one_token_ms(rb, rb.narrow_kv_dtype()))
for k, v in res.items(): print(k, [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
