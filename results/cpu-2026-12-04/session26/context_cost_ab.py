"""Trees sized at the step's context against trees sized at a 256-token context, in one
process, alternating per prompt: the same drafter built with this machine's calibrated curve
(measured after 256 and after 2048 cached tokens, ``StepCost.by_context``) and with only its
256-token curve (what every drafter used before: a curve of one context ignores the context).
Beside the plain loop; every output must equal the plain loop's.

Prompts from the package's own generators (never the dev prompts): "short" are the tuning
prompts (bench/tuning_prompts.py, seeds 301-303); "notesN" are the target's greedy answers to
24 generic requests (seed 311), N of them per prompt as notes, then a summary or list request
(the twenty-fifth session's long prompts: N = 12 gives ~1.2k tokens, 20 ~2k).

From the repository root:
  PYTHONPATH=. python3 results/cpu-2026-12-04/session26/context_cost_ab.py WEIGHTS PROMPTS DRAFTER [COUNT] [NEW]
  WEIGHTS: float32 or file; PROMPTS: short or notesN; DRAFTER: a registry name.
"""
import json
import sys

import torch

from bench.tuning_prompts import tuning_prompts
from specdec_kernels import ops
from specdec_kernels.decoding import ModelRunner, generate, make_drafter
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels.training.prompts import first_stage_prompts

weights, kind, drafter = sys.argv[1], sys.argv[2], sys.argv[3]
count = int(sys.argv[4]) if len(sys.argv) > 4 else 6
new = int(sys.argv[5]) if len(sys.argv) > 5 else 96
loaded = load_default_model(dtype=torch.float32, weights=weights)
tok = loaded.tokenizer
if kind == "short":
    prompts = tuning_prompts(loaded, count=max(count // 3, 1))[:count]
else:
    notes = int(kind.removeprefix("notes"))
    requests = first_stage_prompts(24, seed=311)
    answers = [tok.decode(generate(loaded, encode_prompts(tok, [r]), max_new_tokens=96).tokens[0],
                          skip_special_tokens=True) for r in requests]
    asks = ["Summarize the notes above in a few sentences.", "List the main topics of the notes above."]
    prompts = encode_prompts(tok, ["Notes:\n\n" + "\n\n".join(answers[(i + j) % 24] for j in range(notes))
                                   + "\n\n" + asks[i % 2] for i in range(count)])
runner = ModelRunner(loaded.model)
by_context = runner.step_cost()  # this machine's, calibrated once (SPECDEC_CACHE_DIR)
runner.release()
short_only = StepCost(dict(by_context.points), source="the 256-token curve alone")
methods = {"plain": lambda: None,
           f"{drafter}-p256": lambda: make_drafter(drafter, cost_curve=short_only),
           f"{drafter}-context": lambda: make_drafter(drafter, cost_curve=by_context)}
for make in methods.values():
    generate(loaded, prompts[:1], drafter=make(), max_new_tokens=8)
res = {m: [0.0, 0, 0] for m in methods}
for p in prompts:
    ref = None
    for m, make in methods.items():
        o = generate(loaded, [p], drafter=make(), max_new_tokens=new)
        res[m][0] += o.stats.decode_seconds
        res[m][1] += o.stats.new_tokens
        res[m][2] += o.stats.requests[0].target_forwards
        ref = o.tokens[0] if ref is None else ref
        assert o.tokens[0] == ref, m
out = {"isa": ops.cpu_isa(), "weights": weights, "prompts": kind, "drafter": drafter,
       "count": len(prompts), "prompt_tokens": [len(p) for p in prompts], "new_tokens": new,
       "curve": {str(p): dict(c) for p, c in by_context.by_prefix},
       **{m: {"decode tok/s": round(n / s, 1), "tau": round(n / f, 2)} for m, (s, n, f) in res.items()}}
speed = {m: n / s for m, (s, n, f) in res.items()}
out["context/p256"] = round(speed[f"{drafter}-context"] / speed[f"{drafter}-p256"], 3)
print(json.dumps(out))
