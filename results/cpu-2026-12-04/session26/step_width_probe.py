"""Each verification forward of a real decode: its width, the context, its measured time, and
what the calibrated curve says it costs (c(T, context)); and the propose time of the drafter.
One drafter, one curve kind (p256 or context), the notesN prompts of context_cost_ab.py.
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/step_width_probe.py WEIGHTS notesN DRAFTER CURVE [COUNT] [NEW]"""
import json, sys, time, statistics
import torch
from specdec_kernels.decoding import ModelRunner, generate, make_drafter
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding import runner as runner_mod
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels.training.prompts import first_stage_prompts

weights, kind, drafter, which = sys.argv[1:5]
count = int(sys.argv[5]) if len(sys.argv) > 5 else 3
new = int(sys.argv[6]) if len(sys.argv) > 6 else 96
loaded = load_default_model(dtype=torch.float32, weights=weights)
tok = loaded.tokenizer
notes = int(kind.removeprefix("notes"))
requests = first_stage_prompts(24, seed=311)
answers = [tok.decode(generate(loaded, encode_prompts(tok, [r]), max_new_tokens=96).tokens[0],
                      skip_special_tokens=True) for r in requests]
asks = ["Summarize the notes above in a few sentences.", "List the main topics of the notes above."]
prompts = encode_prompts(tok, ["Notes:\n\n" + "\n\n".join(answers[(i + j) % 24] for j in range(notes))
                               + "\n\n" + asks[i % 2] for i in range(count)])
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
