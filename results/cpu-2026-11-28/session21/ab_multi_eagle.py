"""A/B: the multi drafter's default prophets against the same plus EAGLE, tuning prompts, float32
target, one process, interleaved per prompt."""
import json, sys, time, torch
from specdec_kernels.decoding import generate, factory
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops
loaded = load_default_model(dtype=torch.float32, weights=sys.argv[1] if len(sys.argv) > 1 else "float32")
tok = loaded.tokenizer
count, new = 4, 128
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
base = "prompt-lookup,suffix,token-recycling,retrieval,medusa"
kinds = {"default": base, "+eagle": base + ",eagle", "eagle": None}
drafters = {k: (factory.make_drafter("multi", prophets=v) if v else factory.make_drafter("eagle")) for k, v in kinds.items()}
for k in kinds: generate(loaded, prompts[:1], drafter=drafters[k], max_new_tokens=16)
res = {k: {"s": 0.0, "tokens": 0, "forwards": 0} for k in kinds}
for rep in range(2):
    for i, p in enumerate(prompts):
        for k in (list(kinds) if (i + rep) % 2 == 0 else list(kinds)[::-1]):
            t = time.perf_counter(); o = generate(loaded, [p], drafter=drafters[k], max_new_tokens=new); dt = time.perf_counter() - t
            r = res[k]; r["s"] += dt; r["tokens"] += o.stats.new_tokens; r["forwards"] += o.stats.target_forwards
b = res["default"]
print(json.dumps({"isa": ops.cpu_isa(), **{k: {"tok_s": round(r["tokens"] / r["s"], 1), "tau": round(r["tokens"] / r["forwards"], 3), "vs_default": round((r["tokens"] / r["s"]) / (b["tokens"] / b["s"]), 3)} for k, r in res.items()}}))
