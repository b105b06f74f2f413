"""Is the budget's acceptance model calibrated? For each step of a real decode, the expected
tokens of the kept tree (TreeBudget.choose) against the tokens the step emitted, summed by
kept size. PYTHONPATH=. python3 .../expected_vs_real_probe.py WEIGHTS PROMPTS DRAFTER CURVE [COUNT] [NEW]
PROMPTS: short or notesN (as context_cost_ab.py); CURVE: p256 or context."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab_lib import script_inputs
import json
from specdec_kernels.decoding import ModelRunner, generate, make_drafter
from specdec_kernels.decoding import budget as budget_mod
from specdec_kernels.decoding.cost import StepCost

(weights, kind, drafter, which), count, new, loaded, prompts = script_inputs(4, 3)
r = ModelRunner(loaded.model); curve = r.step_cost(); r.release()
cost = curve if which == "context" else StepCost(dict(curve.points))
expected = []
orig = budget_mod.TreeBudget.choose
def spy(self, trees, context=None):
    kept, exp, c = orig(self, trees, context)
    expected.append((id(self), len(kept[0]), exp))
    return kept, exp, c
budget_mod.TreeBudget.choose = spy
by_size = {}
for p in prompts:
    expected.clear()
    d = make_drafter(drafter, cost_curve=cost)
    o = generate(loaded, [p], drafter=d, max_new_tokens=new)
    mine = [(k, x) for who, k, x in expected if who == id(d.budget)]  # the drafter's own choice
    req = o.stats.requests[0]
    # tokens per step are not kept per step: compare per prompt
    steps = req.target_forwards
    emitted = o.stats.new_tokens
    assert len(mine) == steps, (len(mine), steps)
    e = sum(x for _, x in mine)
    by_size.setdefault("prompts", []).append({"steps": steps, "emitted": emitted,
                                              "expected": round(e, 1), "mean kept": round(sum(s for s, _ in mine) / steps, 2)})
print(json.dumps({"weights": weights, "prompts": kind, "drafter": drafter, "curve": which, **by_size}))
