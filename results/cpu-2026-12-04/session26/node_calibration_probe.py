"""Is each kept node's modelled chance of acceptance (its path probability in the budget) what
happens? Every kept node of every step of the multi drafter, bucketed by predicted P(path) and
by how many prophets proposed it, against whether the target accepted it.
PYTHONPATH=. python3 .../node_calibration_probe.py WEIGHTS PROMPTS [COUNT] [NEW]  (PROMPTS: short or notesN)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab_lib import prompts_for
import json
import torch
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding import budget as budget_mod
from specdec_kernels.decoding.multi import MultiDrafter
from specdec_kernels.models import load_default_model

weights, kind = sys.argv[1:3]
count = int(sys.argv[3]) if len(sys.argv) > 3 else 3
new = int(sys.argv[4]) if len(sys.argv) > 4 else 96
loaded = load_default_model(dtype=torch.float32, weights=weights)
prompts = prompts_for(loaded, kind, count)
last = {}
orig_choose = budget_mod.TreeBudget.choose
def choose(self, trees, context=None):
    out = orig_choose(self, trees, context)
    last[id(self)] = (trees, out[0])
    return out
budget_mod.TreeBudget.choose = choose
DETAIL = True
detail = {}  # labels and depth of a tried kept node -> [n, accepted, sum predicted cond]
table = {}  # (sources, bucket) -> [n, accepted, sum predicted]
orig_accept = MultiDrafter.accept
def accept(self, state, outcome):
    trees, kept = last[id(self.budget)]
    for b, cand in enumerate(self._candidates):
        n = outcome.num_accepted[b]
        start = outcome.previous_starts[b] + 1
        path = set(cand.follow(state.contexts[b][start:start + n]))
        probs = trees[b][1]
        for node in kept[b][1:]:
            k = min(len(cand.sources[node]), 3)
            p = probs[node]
            key = f"{k} prophet(s), p {min(int(p * 5), 4) / 5:.1f}-{min(int(p * 5), 4) / 5 + 0.2:.1f}"
            row = table.setdefault(key, [0, 0, 0.0])
            row[0] += 1; row[1] += node in path; row[2] += p
            if DETAIL:
                parent = cand.parents[node]
                if parent == 0 or parent in path:  # tried: judge its own conditional rate
                    labels = "+".join(sorted(cand.label(x) for x in cand.sources[node]))
                    cond = self.stats.combined({cand.label(x): r for x, r in cand.sources[node].items()}, cand.depths[node])
                    dkey = f"{labels} d{min(cand.depths[node], 4)}"
                    row = detail.setdefault(dkey, [0, 0, 0.0])
                    row[0] += 1; row[1] += node in path; row[2] += cond
    return orig_accept(self, state, outcome)
MultiDrafter.accept = accept
for p in prompts:
    generate(loaded, [p], drafter=make_drafter("multi"), max_new_tokens=new)
print(json.dumps({"weights": weights, "prompts": kind,
                  "nodes": {k: {"kept": n, "accepted": round(a / n, 3), "predicted": round(s / n, 3)}
                            for k, (n, a, s) in sorted(table.items())},
                  "tried kept nodes: conditional rate": {k: {"tried": n, "accepted": round(a / n, 3), "predicted": round(s / n, 3)}
                            for k, (n, a, s) in sorted(detail.items()) if n >= 5}}))
