"""A/B of the quantized-self copy's LM head: int8 (the default) against int4 with its top N
re-scored by the target's rows (rerank=N), tuning prompts, one process, interleaved per prompt.
Usage: ab_head.py CONFIGS (e.g. 8:0,4:4,4:8 = head_bits:rerank) [prompts] [tokens]"""
import json, os, sys, time, torch
TEMP = float(os.environ.get('TEMP', '0'))
SAMPLE = dict(temperature=TEMP, top_p=0.9, seed=7) if TEMP else {}
from specdec_kernels.decoding import generate, QuantizedSelfDrafter
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops

configs = [tuple(int(v) for v in (c + ":7").split(":")[:3]) for c in sys.argv[1].split(",")]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
new = int(sys.argv[3]) if len(sys.argv) > 3 else 128
loaded = load_default_model(dtype=torch.float32, weights="float32")
tok = loaded.tokenizer
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
drafters = {c: QuantizedSelfDrafter(head_bits=c[0], rerank=c[1], num_draft=c[2]) for c in configs}
for c in configs:
    generate(loaded, prompts[:1], drafter=drafters[c], max_new_tokens=16)
res = {c: {"s": 0.0, "tokens": 0, "forwards": 0, "out": []} for c in configs}
for rep in range(2):
    for i, p in enumerate(prompts):
        for c in (configs if (i + rep) % 2 == 0 else configs[::-1]):
            t = time.perf_counter(); o = generate(loaded, [p], drafter=drafters[c], max_new_tokens=new, **SAMPLE)
            dt = time.perf_counter() - t
            r = res[c]; r["s"] += dt; r["tokens"] += o.stats.new_tokens; r["forwards"] += o.stats.target_forwards
            if rep == 0: r["out"].append(o.tokens[0])
base = res[configs[0]]
summary = {"temperature": TEMP, "isa": ops.cpu_isa(), "prompts": len(prompts), "new_tokens": new}
for c in configs:
    r = res[c]
    summary[f"head{c[0]}-rerank{c[1]}-K{c[2]}"] = {"tok_s": round(r["tokens"] / r["s"], 1), "tau": round(r["tokens"] / r["forwards"], 3),
        "vs_first": round((r["tokens"] / r["s"]) / (base["tokens"] / base["s"]), 3), "identical": r["out"] == base["out"]}
print(json.dumps(summary))
