"""multi with the quantized copy among its prophets, interleaved prompt by prompt."""
import sys, time, statistics
sys.path.insert(0, "/work/main")
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.drafters import default_prophets
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=1)
ids = encode_prompts(tok, [p.text for p in prompts])
print("default prophets:", default_prophets())
configs = {
    "plain": lambda: None,
    "qself": lambda: make_drafter("quantized-self"),
    "multi": lambda: make_drafter("multi"),
    "multi+qself": lambda: make_drafter("multi", prophets=list(default_prophets()) + ["quantized-self"]),
    "qself+lookup+suffix": lambda: make_drafter("multi", prophets=["quantized-self", "prompt-lookup", "suffix"]),
}
drafters = {k: f() for k, f in configs.items()}
for name, d in drafters.items():
    generate(model, [ids[0]], drafter=d, max_new_tokens=16, tokenizer=tok)
times = {k: {} for k in configs}; taus = {k: {} for k in configs}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for rnd in range(rounds):
    for p, x in zip(prompts, ids):
        order = list(configs) if rnd % 2 == 0 else list(configs)[::-1]
        for name in order:
            t = time.perf_counter()
            out = generate(model, [x], drafter=drafters[name], max_new_tokens=64, tokenizer=tok)
            times[name].setdefault(p.category, []).append(time.perf_counter() - t)
            taus[name].setdefault(p.category, []).append(out.stats.requests[0].tau)
cats = list(times["plain"])
print("vs plain       " + " ".join(f"{c[:10]:>10}" for c in cats) + "      total   tau by category")
for name in configs:
    tot = sum(sum(times["plain"][c]) for c in cats) / sum(sum(times[name][c]) for c in cats)
    print(f"{name:20s} " + " ".join(f"{sum(times['plain'][c]) / sum(times[name][c]):10.2f}" for c in cats)
          + f" {tot:8.2f}   " + " ".join(f"{statistics.mean(taus[name][c]):.2f}" for c in cats))
