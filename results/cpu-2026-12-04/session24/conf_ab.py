"""Quantized-self with a confidence cut-off (the chain stops where the draft's top probability
falls below the threshold) against the default, alternating per prompt in one process, on tuning
prompts (the package's prompt generators, seeds 301-303; never the dev prompts).
Run from the repository root: PYTHONPATH=. python3 results/.../conf_ab.py. Usage: conf_ab.py [prompts per stage] [tokens] [thresholds...]"""
import json, sys, time
import torch
from specdec_kernels.decoding import generate, QuantizedSelfDrafter
from bench.tuning_prompts import tuning_prompts
from specdec_kernels.models import load_default_model
from specdec_kernels import ops

count = int(sys.argv[1]) if len(sys.argv) > 1 else 4
new = int(sys.argv[2]) if len(sys.argv) > 2 else 96
thresholds = [float(t) for t in sys.argv[3:]] or [0.3, 0.5]
loaded = load_default_model(dtype=torch.float32, weights="float32")
prompts = tuning_prompts(loaded, count)
methods = {"plain": None, "qs": QuantizedSelfDrafter()}
for t in thresholds:
    methods[f"qs-conf{t}"] = QuantizedSelfDrafter(confidence_threshold=t)
for d in methods.values():
    generate(loaded, prompts[:1], drafter=d, max_new_tokens=16)
res = {m: [0.0, 0, 0] for m in methods}
for p in prompts:
    ref = None
    for m, d in methods.items():
        t = time.perf_counter(); o = generate(loaded, [p], drafter=d, max_new_tokens=new)
        res[m][0] += time.perf_counter() - t; res[m][1] += o.stats.new_tokens
        res[m][2] += getattr(o.stats, "target_forwards", 0) or 0
        ref = o.tokens[0] if ref is None else ref
        assert o.tokens[0] == ref, m
print(json.dumps({"isa": ops.cpu_isa(), "prompts": len(prompts), **{m: {"tok/s": round(n / s, 1), "tau": round(n / f, 2) if f else None} for m, (s, n, f) in res.items()}}))
