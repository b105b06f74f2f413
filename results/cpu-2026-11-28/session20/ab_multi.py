"""quantized-self alone vs multi with quantized-self among its prophets, tuning prompts (never
dev), fp32 target, one process, interleaved."""
import json, sys, time, torch
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops
loaded = load_default_model(dtype=torch.float32, weights="float32")
tok = loaded.tokenizer
count = 4
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
configs = {
  "qself": lambda: make_drafter("quantized-self"),
  "multi[qself,suffix]": lambda: make_drafter("multi", prophets="quantized-self,suffix"),
  "multi[qself,suffix,prompt-lookup]": lambda: make_drafter("multi", prophets="quantized-self,suffix,prompt-lookup"),
}
for name, mk in configs.items():
    generate(loaded, prompts[:1], drafter=mk(), max_new_tokens=16)
res = {n: [0.0, 0, 0, []] for n in configs}
for rep in range(2):
    for i, p in enumerate(prompts):
        names = list(configs) if (i + rep) % 2 == 0 else list(configs)[::-1]
        for n in names:
            t = time.perf_counter(); o = generate(loaded, [p], drafter=configs[n](), max_new_tokens=128); dt = time.perf_counter() - t
            r = res[n]; r[0] += dt; r[1] += o.stats.new_tokens; r[2] += o.stats.target_forwards
            if rep == 0: r[3].append(o.tokens[0])
base = res["qself"]
print(json.dumps({"isa": ops.cpu_isa(), **{n: {"tok_s": round(r[1]/r[0], 1), "tau": round(r[1]/r[2], 3), "vs_qself": round((r[1]/r[0])/(base[1]/base[0]), 3), "identical": r[3] == base[3]} for n, r in res.items()}}))
