"""A chain drafter's lengths costed at the step's context (the target's c(T) and the draft's
own cost measured after 256 and 2048 cached tokens) against costed at 256 cached tokens, in one
process, alternating per prompt, beside the plain loop (outputs must equal the plain loop's).
"p256" runs with StepCost answering every context with its shortest curve (what the package did
before this session); "context" as shipped. Prompts as context_cost_ab.py.
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/chain_context_ab.py WEIGHTS PROMPTS DRAFTER [COUNT] [NEW]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ab_lib import alternate, report, script_inputs
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding.cost import StepCost

(weights, kind, drafter), count, new, loaded, prompts = script_inputs(3, 6)
at_context = StepCost.__call__


def at_shortest(self, width, context=None):
    return at_context(self, width, None)


def run_with(variant):
    def run(p, tokens):
        StepCost.__call__ = variant or at_context
        return generate(loaded, [p], drafter=make_drafter(drafter) if variant else None,
                        max_new_tokens=tokens)
    return run


variants = {"plain": None, f"{drafter}-p256": at_shortest, f"{drafter}-context": at_context}
res = alternate(prompts, {name: run_with(v) for name, v in variants.items()}, new)
report({"weights": weights, "prompts": kind, "drafter": drafter}, prompts, new, res,
       {"context/p256": (f"{drafter}-context", f"{drafter}-p256")})
