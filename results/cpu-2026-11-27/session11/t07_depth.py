"""EAGLE at T=0.7 top-p 0.9: configurations interleaved prompt by prompt (12 dev prompts)."""
import json, sys, time
from specdec_kernels.data import load_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.models import load_model
loaded = load_model("default", weights="float32")
rows = load_prompts()
cats = {}
for r in rows:
    cats.setdefault(r["category"], []).append(r["turns"][0])
prompts = [p for c in sorted(cats) for p in cats[c][:1]][:12]
configs = [("plain", None)] + [(json.dumps(o), o) for o in map(json.loads, sys.argv[1:])]
drafters = {n: (make_drafter("eagle", **o) if o is not None else None) for n, o in configs}
kw = dict(temperature=0.7, top_p=0.9, seed=0, max_new_tokens=96)
tot = {n: [0.0, 0, 0, 0.0] for n, _ in configs}
for n, d in drafters.items():
    generate(loaded, prompts[:1], drafter=d, **{**kw, "max_new_tokens": 8})
for p in prompts:
    for n, d in drafters.items():
        s = generate(loaded, [p], drafter=d, **kw).stats
        t = tot[n]; t[0] += s.seconds; t[1] += s.new_tokens; t[2] += s.target_forwards; t[3] += s.drafter_seconds
base = tot["plain"][1] / tot["plain"][0]
for n, (sec, new, steps, dr) in tot.items():
    rep = drafters[n].report() if drafters[n] else {}
    print(f"{n}: {new/sec:.1f} tok/s ({new/sec/base:.3f}x plain), tau {new/steps:.2f}, drafter {1e3*dr/steps:.1f} ms/step, forwards/step {rep.get('draft_forwards_per_step', 0):.2f}, nodes/step {rep.get('tree_nodes_per_step', 0):.1f}")
