"""qself with and without the chain budget, and plain, interleaved prompt by prompt."""
import sys, time, json, statistics
sys.path.insert(0, "/work/main")
import torch
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter

loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=int(sys.argv[1]) if len(sys.argv) > 1 else 1)
ids = encode_prompts(tok, [p.text for p in prompts])
configs = {
    "plain": None,
    "qself-budget": make_drafter("quantized-self"),
    "qself-k3": make_drafter("quantized-self", budget=False),
}
if len(sys.argv) > 2:
    configs["qself-budget-k%s" % sys.argv[2]] = make_drafter("quantized-self", num_draft=int(sys.argv[2]))
times = {k: {} for k in configs}
taus = {k: {} for k in configs}
for name, make in configs.items():  # warm-up
    generate(model, [ids[0]], drafter=make, max_new_tokens=16, tokenizer=tok)
for rnd in range(2):
    for p, x in zip(prompts, ids):
        order = list(configs) if rnd % 2 == 0 else list(configs)[::-1]
        for name in order:
            t = time.perf_counter()
            out = generate(model, [x], drafter=configs[name], max_new_tokens=64, tokenizer=tok)
            times[name].setdefault(p.category, []).append(time.perf_counter() - t)
            taus[name].setdefault(p.category, []).append(out.stats.requests[0].tau)
cats = list(times["plain"])
print("category " + " ".join(f"{c[:10]:>10}" for c in cats) + "      total")
for name in configs:
    tot = sum(sum(times[name][c]) for c in cats) / sum(sum(times["plain"][c]) for c in cats)
    print(f"{name:14} " + " ".join(f"{sum(times['plain'][c]) / sum(times[name][c]):10.2f}" for c in cats)
          + f" {1 / tot:10.2f}   tau " + " ".join(f"{statistics.mean(taus[name][c]):.2f}" for c in cats))
