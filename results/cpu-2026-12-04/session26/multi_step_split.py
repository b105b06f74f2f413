"""Where a merged-drafter step goes at a GGUF file's precision: the time of each prophet's
propose, the budget, the verification forward and the rest, summed over a decode of the tuning
prompts (seeds 301-303), beside the plain loop's step.
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/multi_step_split.py [WEIGHTS] [COUNT] [NEW]"""
import json, sys, time, collections
import torch
from bench.tuning_prompts import tuning_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding import runner as runner_mod, multi as multi_mod
from specdec_kernels.models import load_default_model

weights = sys.argv[1] if len(sys.argv) > 1 else "file"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 6
new = int(sys.argv[3]) if len(sys.argv) > 3 else 96
loaded = load_default_model(dtype=torch.float32, weights=weights)
prompts = tuning_prompts(loaded, count=max(count // 3, 1))[:count]
spent = collections.Counter()
def timed(owner, name, key):
    orig = getattr(owner, name)
    def wrapper(*a, **k):
        t = time.perf_counter(); out = orig(*a, **k); spent[key] += time.perf_counter() - t
        return out
    setattr(owner, name, wrapper)
orig_forward = runner_mod.ModelRunner.forward
def forward(self, *a, **k):
    t = time.perf_counter(); out = orig_forward(self, *a, **k)
    if not k.get("prefill"):
        spent["verification forward"] += time.perf_counter() - t
    return out
runner_mod.ModelRunner.forward = forward
timed(multi_mod.MultiDrafter, "propose", "multi propose (all)")
timed(multi_mod.MultiDrafter, "accept", "multi accept (all)")
timed(multi_mod, "budgeted_trees", "budget (budgeted_trees)")
d0 = make_drafter("multi")
generate(loaded, prompts[:1], drafter=d0, max_new_tokens=8)
for prophet in d0.drafters:  # each prophet's class: its propose and accept
    cls = type(prophet)
    timed(cls, "propose", f"{prophet.name} propose")
    timed(cls, "accept", f"{prophet.name} accept")
out = {}
for label, make in (("plain", lambda: None), ("multi", lambda: make_drafter("multi"))):
    spent.clear()
    total = steps = tokens = 0
    per_prophet = collections.Counter()
    for p in prompts:
        d = make()
        o = generate(loaded, [p], drafter=d, max_new_tokens=new)
        total += o.stats.decode_seconds; steps += o.stats.requests[0].target_forwards; tokens += o.stats.new_tokens
        if d is not None:
            for name, rep in o.stats.drafter_report["prophets"].items():
                per_prophet[name] += rep["steps_paused"]
    out[label] = {"decode s": round(total, 3), "steps": steps, "tokens": tokens,
                  "ms per step": round(total / steps * 1e3, 2),
                  "split ms per step": {k: round(v / steps * 1e3, 2) for k, v in spent.items()},
                  "steps paused": dict(per_prophet)}
print(json.dumps({"weights": weights, **out}))
