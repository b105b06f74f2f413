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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch

from ab_lib import alternate, prompts_for, report
from specdec_kernels.decoding import ModelRunner, generate, make_drafter
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.models import load_default_model

weights, kind, drafter = sys.argv[1], sys.argv[2], sys.argv[3]
count = int(sys.argv[4]) if len(sys.argv) > 4 else 6
new = int(sys.argv[5]) if len(sys.argv) > 5 else 96
loaded = load_default_model(dtype=torch.float32, weights=weights)
prompts = prompts_for(loaded, kind, count)
runner = ModelRunner(loaded.model)
by_context = runner.step_cost()  # this machine's, calibrated once (SPECDEC_CACHE_DIR)
runner.release()
short_only = StepCost(dict(by_context.points), source="the 256-token curve alone")
curves = {"plain": None, f"{drafter}-p256": short_only, f"{drafter}-context": by_context}
runs = {name: (lambda p, n, curve=curve: generate(
            loaded, [p], drafter=make_drafter(drafter, cost_curve=curve) if curve else None,
            max_new_tokens=n)) for name, curve in curves.items()}
res = alternate(prompts, runs, new)
report({"weights": weights, "prompts": kind, "drafter": drafter,
        "curve": {str(p): dict(c) for p, c in by_context.by_prefix}}, prompts, new, res,
       {"context/p256": (f"{drafter}-context", f"{drafter}-p256")})
