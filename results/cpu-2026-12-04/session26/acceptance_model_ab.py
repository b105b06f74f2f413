"""The budget's acceptance model, three ways, alternating per prompt in one process beside the
plain loop (outputs must equal the plain loop's): "independent", the prophets' own rates taken
as independent and no delivery scale (before this session); "agreement", a node's rate from the
record of nodes proposed by exactly its set of prophets (AcceptanceStats.combined), no scale;
"scaled", agreement and path probabilities scaled by the delivery so far
(AcceptanceStats.delivery, budgeted_trees).

"agreement" and "scaled" were measured, found inside the spread, and not kept: to run this
again, apply acceptance_model_variants.patch (beside this script) to the repository first. The step cost is this machine's calibrated curve, at the step's context.
Prompts as context_cost_ab.py (short: tuning prompts 301-303; notesN: seed 311 notes).
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/agreement_ab.py WEIGHTS PROMPTS DRAFTER [COUNT] [NEW]"""
import json, sys
import torch
from bench.tuning_prompts import tuning_prompts
from specdec_kernels import ops
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding.budget import AcceptanceStats
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels.training.prompts import first_stage_prompts

weights, kind, drafter = sys.argv[1:4]
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
agreement = AcceptanceStats.combined


def independent(self, sources, depth):
    miss = 1.0
    for prophet, rank in sources.items():
        miss *= 1.0 - self.rate(prophet, depth, rank)
    return 1.0 - miss


delivery = AcceptanceStats.delivery
rules = {"plain": None, f"{drafter}-independent": (independent, lambda self: 1.0),
         f"{drafter}-agreement": (agreement, lambda self: 1.0),
         f"{drafter}-scaled": (agreement, delivery)}


def run(rule, p, tokens):
    AcceptanceStats.combined, AcceptanceStats.delivery = rule or (agreement, delivery)
    return generate(loaded, [p], drafter=make_drafter(drafter) if rule else None, max_new_tokens=tokens)


for rule in rules.values():
    run(rule, prompts[0], 8)
res = {m: [0.0, 0, 0] for m in rules}
for p in prompts:
    ref = None
    for m, rule in rules.items():
        o = run(rule, p, new)
        res[m][0] += o.stats.decode_seconds
        res[m][1] += o.stats.new_tokens
        res[m][2] += o.stats.requests[0].target_forwards
        ref = o.tokens[0] if ref is None else ref
        assert o.tokens[0] == ref, m
speed = {m: n / s for m, (s, n, f) in res.items()}
print(json.dumps({"isa": ops.cpu_isa(), "weights": weights, "prompts": kind, "drafter": drafter,
                  "count": len(prompts), "prompt_tokens": [len(p) for p in prompts], "new_tokens": new,
                  **{m: {"decode tok/s": round(n / s, 1), "tau": round(n / f, 2)} for m, (s, n, f) in res.items()},
                  "agreement/independent": round(speed[f"{drafter}-agreement"] / speed[f"{drafter}-independent"], 3),
                  "scaled/independent": round(speed[f"{drafter}-scaled"] / speed[f"{drafter}-independent"], 3)}))
