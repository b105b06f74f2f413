"""Issue 24's projected GPU speedup: acceptance measured here (bench6-new, 36 dev prompts,
greedy, AVX-512) on the H200 step-cost curve of 2026-11-26 (bench/results/h200-2026-11-26b).

EAGLE's draft cost on the GPU: its measured draft forwards per step (2.09-2.14, the catch-up
included: `python3 bench/eagle_step_split.py`, this session) times one forward's weight share
of a one-token target step (the drafter's `head_cost_fraction` / `max_depth`, as bench recorded
it before any step ran: 6 forwards assumed).

    PYTHONPATH=. python3 results/cpu-2026-11-27/session10/gpu_projection.py
"""
import json
from pathlib import Path

from bench import projection

HERE = Path(__file__).parent
FORWARDS_PER_STEP = 2.1
results = json.loads((HERE / "bench6-new" / "results.json").read_text())
curve = json.loads(Path("bench/results/h200-2026-11-26b/curve-cuda.json").read_text())
settings = results["config"]["method_settings"]["ours-eagle"]
per_forward = settings["head_cost_fraction"] / settings["max_depth"]
for label, forwards in (("measured forwards", FORWARDS_PER_STEP), ("every depth", settings["max_depth"])):
    settings["head_cost_fraction"] = forwards * per_forward
    print(f"## {label}: {forwards} draft forwards a step, {per_forward:.4f} of c(1) each")
    print(projection.markdown(projection.project(results, curve, "135m"), curve, "135m", results))
