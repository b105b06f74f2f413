"""A/B of EagleDrafter(draft_dtype=float32|int8) on tuning prompts (never the dev prompts), one
process, interleaved per prompt, drafters built once. Usage: ab_eagle.py WEIGHTS [prompts] [tokens]"""
import json, sys, time, torch
from specdec_kernels.decoding import generate
from specdec_kernels.decoding.eagle import EagleDrafter
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops

weights = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
new = int(sys.argv[3]) if len(sys.argv) > 3 else 128
loaded = load_default_model(dtype=torch.float32, weights=weights)
tok = loaded.tokenizer
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
kinds = ["float32", "int8"]
drafters = {k: EagleDrafter(draft_dtype=k) for k in kinds}
for k in kinds:
    generate(loaded, prompts[:1], drafter=drafters[k], max_new_tokens=16)
res = {k: {"s": 0.0, "tokens": 0, "forwards": 0, "out": []} for k in kinds}
for rep in range(2):
    for i, p in enumerate(prompts):
        for k in (kinds if (i + rep) % 2 == 0 else kinds[::-1]):
            t = time.perf_counter()
            o = generate(loaded, [p], drafter=drafters[k], max_new_tokens=new)
            dt = time.perf_counter() - t
            r = res[k]; r["s"] += dt; r["tokens"] += o.stats.new_tokens; r["forwards"] += o.stats.target_forwards
            if rep == 0: r["out"].append(o.tokens[0])
base = res[kinds[0]]
summary = {"isa": ops.cpu_isa(), "weights": weights, "prompts": len(prompts), "new_tokens": new}
for k in kinds:
    r = res[k]
    summary[k] = {"tok_s": round(r["tokens"] / r["s"], 1), "tau": round(r["tokens"] / r["forwards"], 3),
                  "vs_float32": round((r["tokens"] / r["s"]) / (base["tokens"] / base["s"]), 3),
                  "identical": r["out"] == base["out"]}
print(json.dumps(summary))
