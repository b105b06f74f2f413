"""Token recycling with its template kept while its statistics stand still (this session)
against choosing it every step (before), beside the plain loop, alternating per prompt in one
process, on tuning prompts (the package's prompt generators, seeds 301-303; never the dev
prompts). From the repository root: PYTHONPATH=. python3 results/.../tr_template_ab.py
Usage: tr_template_ab.py WEIGHTS [prompts per stage] [tokens]"""
import json, sys, time
import torch
from specdec_kernels.decoding import generate, TokenRecyclingDrafter
from bench.tuning_prompts import tuning_prompts
from specdec_kernels.models import load_default_model
from specdec_kernels import ops


class EveryStep(TokenRecyclingDrafter):
    def _template_of(self, b, remaining):
        return self.template(self._stats[b], remaining)


weights = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
new = int(sys.argv[3]) if len(sys.argv) > 3 else 96
loaded = load_default_model(dtype=torch.float32, weights=weights)
prompts = tuning_prompts(loaded, count)
methods = {"plain": lambda: None, "tr-before": EveryStep, "tr-now": TokenRecyclingDrafter}
for make in methods.values():
    generate(loaded, prompts[:1], drafter=make(), max_new_tokens=16)
res = {m: [0.0, 0, 0] for m in methods}
for p in prompts:
    ref = None
    for m, make in methods.items():
        t = time.perf_counter(); o = generate(loaded, [p], drafter=make(), max_new_tokens=new)
        res[m][0] += time.perf_counter() - t; res[m][1] += o.stats.new_tokens; res[m][2] += o.stats.target_forwards
        ref = o.tokens[0] if ref is None else ref
        assert o.tokens[0] == ref, m
print(json.dumps({"weights": weights, "isa": ops.cpu_isa(), "prompts": len(prompts),
                  **{m: {"tok/s": round(n / s, 1), "tau": round(n / f, 2)} for m, (s, n, f) in res.items()}}))
