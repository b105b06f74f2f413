"""A/B of QuantizedSelfDrafter(num_draft=K) on tuning prompts (never the dev prompts), one
process, interleaved per prompt. Usage: ab_vocab.py SIZES (comma list, 0 = full) [prompts] [tokens]"""
import json, sys, time, statistics, torch
from specdec_kernels.decoding import generate, QuantizedSelfDrafter
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops

sizes = [int(x) for x in sys.argv[1].split(",")]  # num_draft values
count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
new = int(sys.argv[3]) if len(sys.argv) > 3 else 128
kind = sys.argv[4] if len(sys.argv) > 4 else "quantized-self"
loaded = load_default_model(dtype=torch.float32, weights="float32")
tok = loaded.tokenizer
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
def drafter(n):
    return QuantizedSelfDrafter(num_draft=n)
for n in sizes:  # warm up (and measure draft cost once)
    generate(loaded, prompts[:1], drafter=drafter(n), max_new_tokens=16)
res = {n: {"s": 0.0, "tokens": 0, "forwards": 0, "out": []} for n in sizes}
for rep in range(2):
    for i, p in enumerate(prompts):
        order = sizes if (i + rep) % 2 == 0 else sizes[::-1]
        for n in order:
            t = time.perf_counter()
            o = generate(loaded, [p], drafter=drafter(n), max_new_tokens=new)
            dt = time.perf_counter() - t
            r = res[n]; r["s"] += dt; r["tokens"] += o.stats.new_tokens; r["forwards"] += o.stats.target_forwards
            if rep == 0: r["out"].append(o.tokens[0])
base = res[sizes[0]]
summary = {"isa": ops.cpu_isa(), "prompts": len(prompts), "new_tokens": new}
for n in sizes:
    r = res[n]
    summary[str(n)] = {"tok_s": round(r["tokens"] / r["s"], 1), "tau": round(r["tokens"] / r["forwards"], 3),
                       "vs_first": round((r["tokens"] / r["s"]) / (base["tokens"] / base["s"]), 3),
                       "identical": r["out"] == base["out"]}
print(json.dumps(summary, indent=1))
