"""Each verification forward of a real decode: its width, the context, its measured time, and
what the calibrated curve says it costs (c(T, context)); and the propose time of the drafter.
One drafter, one curve kind (p256 or context), the notesN prompts of context_cost_ab.py.
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/step_width_probe.py WEIGHTS notesN DRAFTER CURVE [COUNT] [NEW]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab_lib import script_inputs
import json, time, statistics
from specdec_kernels.decoding import ModelRunner, generate, make_drafter
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding import runner as runner_mod

(weights, kind, drafter, which), count, new, loaded, prompts = script_inputs(4, 3)
r = ModelRunner(loaded.model); curve = r.step_cost(); r.release()
cost = curve if which == "context" else StepCost(dict(curve.points))
rows = []
orig = runner_mod.ModelRunner.forward
def timed(self, cache, tokens, starts, *a, **k):
    t = time.perf_counter(); out = orig(self, cache, tokens, starts, *a, **k)
    if not k.get("prefill"):
        rows.append((tokens.shape[1], sum(starts) / len(starts), (time.perf_counter() - t) * 1e3))
    return out
runner_mod.ModelRunner.forward = timed
generate(loaded, prompts[:1], drafter=make_drafter(drafter, cost_curve=cost), max_new_tokens=8)
rows.clear()
for p in prompts:
    generate(loaded, [p], drafter=make_drafter(drafter, cost_curve=cost), max_new_tokens=new)
by_width = {}
for w, ctx, ms in rows:
    by_width.setdefault(w, []).append((ctx, ms))
print(json.dumps({"weights": weights, "prompts": kind, "drafter": drafter, "curve": which,
                  "widths": {w: {"steps": len(v), "measured ms": round(statistics.median(m for _, m in v), 2),
                                 "curve ms at its context": round(statistics.median(curve(w, c) for c, _ in v), 2)}
                             for w, v in sorted(by_width.items())}}))
