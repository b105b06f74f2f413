"""τ of the tree drafters with the trees a flat step cost gives (what a GPU's launch-bound step
would size: the budget then keeps max_nodes) against this machine's curve; greedy, so τ does
not depend on timing. Outputs are checked identical to the plain loop's."""
import sys, json, statistics, time
sys.path.insert(0, "/work/main")
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
per = int(sys.argv[1]) if len(sys.argv) > 1 else 2
prompts = select_prompts(load_prompts(), per_category=per)
ids = encode_prompts(tok, [p.text for p in prompts])
FLAT = {"1": 10.0, "256": 10.0}
names = ["token-recycling", "multi", "eagle", "medusa"]
plain = [generate(model, [x], max_new_tokens=64, tokenizer=tok).tokens[0] for x in ids]
res = {}
for name in names:
    for curve_name, curve in (("flat64", FLAT),):
        d = make_drafter(name, cost_curve=curve, max_nodes=64) if curve else make_drafter(name)
        taus, same, width = {}, 0, []
        t0 = time.perf_counter()
        for p, x, ref in zip(prompts, ids, plain):
            out = generate(model, [x], drafter=d, max_new_tokens=64, tokenizer=tok)
            taus.setdefault(p.category, []).append(out.stats.requests[0].tau)
            same += out.tokens[0] == ref
        cats = {c: round(statistics.mean(v), 2) for c, v in taus.items()}
        allt = [t for v in taus.values() for t in v]
        res[(name, curve_name)] = cats
        print(f"{name:16s} {curve_name:8s} tau {statistics.mean(allt):.2f}  " +
              " ".join(f"{c[:8]} {v:.2f}" for c, v in cats.items()) +
              f"  identical {same}/{len(ids)}  {time.perf_counter() - t0:.0f} s", flush=True)
