"""qself at fixed K (budget off) and plain: realized ms per step against the cost model's
c_t(K+1) + K c_d(1), interleaved prompt by prompt."""
import sys, time, statistics, json
sys.path.insert(0, "/work/main")
import torch
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=1)
ids = encode_prompts(tok, [p.text for p in prompts])
Ks = [1, 2, 3, 4]
configs = {"plain": None}
for k in Ks:
    configs[f"K{k}"] = make_drafter("quantized-self", budget=False, num_draft=k)
configs["budget"] = make_drafter("quantized-self")
for name, d in configs.items():
    generate(model, [ids[0]], drafter=d, max_new_tokens=16, tokenizer=tok)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
agg = {n: [0.0, 0, 0, 0.0] for n in configs}  # time, steps, tokens, prefill-free time
per = {n: {} for n in configs}
for r in range(rounds):
    for p, x in zip(prompts, ids):
        order = list(configs) if r % 2 == 0 else list(configs)[::-1]
        for name in order:
            t = time.perf_counter()
            out = generate(model, [x], drafter=configs[name], max_new_tokens=64, tokenizer=tok)
            dt = time.perf_counter() - t
            st = out.stats
            agg[name][0] += dt; agg[name][1] += st.target_forwards; agg[name][2] += len(out.tokens[0]); agg[name][3] += st.decode_seconds; agg[name].append(st.drafter_seconds)
            per[name].setdefault(p.category, []).append((dt, len(out.tokens[0])))
d = configs["budget"]
tc, dc = d._costs
print("curve c_t:", {w: round(tc(w), 1) for w in (1, 2, 3, 4, 5)}, "c_d(1):", round(dc(1), 2))
plain_tps = agg["plain"][2] / agg["plain"][0]
for name, (t, steps, toks, dec, *drs) in agg.items():
    dr = sum(drs)
    k = int(name[1:]) if name.startswith("K") else None
    model_ms = (tc(k + 1) + k * dc(1)) if k else None
    print(f"{name:7s} {toks/t:6.1f} tok/s ({toks/t/plain_tps:4.2f}x plain)  tau {toks/steps:4.2f}  "
          f"{t/steps*1e3:6.1f} ms/step; decode: target {(dec-dr)/steps*1e3:5.1f} drafter {dr/steps*1e3:5.1f}" + (f"  model {tc(k+1):5.1f} + {k*dc(1):5.1f}" if k else ""))
print("budget:", getattr(configs["budget"], "budgets", None) and configs["budget"].budgets.report())
