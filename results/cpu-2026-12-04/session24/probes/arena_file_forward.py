"""The file-precision target's one-token forward, its weights in their own allocations against
one huge-page buffer, alternating (ROUNDS=10 env)."""
import os, statistics, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import one_token_ms, relocate
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model

a = load_model(weights="file").model
b = load_model(weights="file").model
raw = relocate(b)
ra, rb = ModelRunner(a), ModelRunner(b)
with torch.inference_mode():
    res = {"separate": [], "arena huge": []}
    for _ in range(int(os.environ.get("ROUNDS", "10"))):
        res["separate"].append(one_token_ms(ra, steps=40)); res["arena huge"].append(one_token_ms(rb, steps=40))
for k, v in res.items(): print(k, [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
