"""Tokens/s of quantized-self and the plain loop on tuning prompts (the package's prompt
generators, seeds 301-303; never the dev prompts) for the package at ROOT, so that two builds
can be alternated process by process. Usage: ab_versions.py ROOT [prompts] [tokens]"""
import json, sys, time
root = sys.argv[1]
sys.path.insert(0, root)
import torch
from specdec_kernels.decoding import generate, QuantizedSelfDrafter
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops

count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
new = int(sys.argv[3]) if len(sys.argv) > 3 else 96
loaded = load_default_model(dtype=torch.float32, weights="float32")
tok = loaded.tokenizer
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
methods = {"plain": None, "quantized-self": QuantizedSelfDrafter()}
for d in methods.values():
    generate(loaded, prompts[:1], drafter=d, max_new_tokens=16)
res = {m: [0.0, 0] for m in methods}
for p in prompts:
    for m, d in methods.items():
        t = time.perf_counter(); o = generate(loaded, [p], drafter=d, max_new_tokens=new)
        res[m][0] += time.perf_counter() - t; res[m][1] += o.stats.new_tokens
print(json.dumps({"root": root, "isa": ops.cpu_isa(), **{m: round(n / s, 1) for m, (s, n) in res.items()}}))
