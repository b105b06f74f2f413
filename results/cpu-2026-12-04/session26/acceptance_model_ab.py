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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ab_lib import alternate, report, script_inputs
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding.budget import AcceptanceStats

(weights, kind, drafter), count, new, loaded, prompts = script_inputs(3, 6)
agreement = AcceptanceStats.combined
delivery = AcceptanceStats.delivery


def independent(self, sources, depth):
    miss = 1.0
    for prophet, rank in sources.items():
        miss *= 1.0 - self.rate(prophet, depth, rank)
    return 1.0 - miss


def run_with(rule):
    def run(p, tokens):
        AcceptanceStats.combined, AcceptanceStats.delivery = rule or (agreement, delivery)
        return generate(loaded, [p], drafter=make_drafter(drafter) if rule else None,
                        max_new_tokens=tokens)
    return run


rules = {"plain": None, f"{drafter}-independent": (independent, lambda self: 1.0),
         f"{drafter}-agreement": (agreement, lambda self: 1.0),
         f"{drafter}-scaled": (agreement, delivery)}
res = alternate(prompts, {name: run_with(rule) for name, rule in rules.items()}, new)
report({"weights": weights, "prompts": kind, "drafter": drafter}, prompts, new, res,
       {"agreement/independent": (f"{drafter}-agreement", f"{drafter}-independent"),
        "scaled/independent": (f"{drafter}-scaled", f"{drafter}-independent")})
