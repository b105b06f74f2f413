"""A chain drafter's lengths costed at the step's context (the target's c(T) and the draft's
own cost measured after 256 and 2048 cached tokens) against costed at 256 cached tokens, in one
process, alternating per prompt, beside the plain loop (outputs must equal the plain loop's).
"p256" runs with StepCost answering every context with its shortest curve (what the package did
before this session); "context" as shipped. Prompts as context_cost_ab.py.
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/chain_context_ab.py WEIGHTS PROMPTS DRAFTER [COUNT] [NEW]"""
import json, sys
import torch
from bench.tuning_prompts import tuning_prompts
from specdec_kernels import ops
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding.cost import StepCost
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
at_context = StepCost.__call__


def at_shortest(self, width, context=None):
    return at_context(self, width, None)


variants = {"plain": None, f"{drafter}-p256": at_shortest, f"{drafter}-context": at_context}


def run(variant, p, tokens):
    StepCost.__call__ = variant or at_context
    return generate(loaded, [p], drafter=make_drafter(drafter) if variant else None, max_new_tokens=tokens)


for variant in variants.values():
    run(variant, prompts[0], 8)
res = {m: [0.0, 0, 0] for m in variants}
for p in prompts:
    ref = None
    for m, variant in variants.items():
        o = run(variant, p, new)
        res[m][0] += o.stats.decode_seconds
        res[m][1] += o.stats.new_tokens
        res[m][2] += o.stats.requests[0].target_forwards
        ref = o.tokens[0] if ref is None else ref
        assert o.tokens[0] == ref, m
speed = {m: n / s for m, (s, n, f) in res.items()}
print(json.dumps({"isa": ops.cpu_isa(), "weights": weights, "prompts": kind, "drafter": drafter,
                  "count": len(prompts), "prompt_tokens": [len(p) for p in prompts], "new_tokens": new,
                  **{m: {"decode tok/s": round(n / s, 1), "tau": round(n / f, 2)} for m, (s, n, f) in res.items()},
                  "context/p256": round(speed[f"{drafter}-context"] / speed[f"{drafter}-p256"], 3)}))
