"""Where a decoding step goes, plain loop against EAGLE: the default model, the dev prompts'
first turns (one per category), one request at a time, 64 new tokens, greedy; from the engine's
own statistics (decode time, drafter time, target forwards).

    python3 bench/eagle_step_split.py
    python3 bench/eagle_step_split.py --eagle '{"branching": 4}' --eagle '{"max_nodes": 16}'

Each ``--eagle`` is one EAGLE configuration (``make_drafter("eagle", **options)``), measured
after the plain loop; none: the defaults.
"""

import argparse
import json

from specdec_kernels.data import load_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.models import load_model


def step_split(loaded, prompts: list, drafter_name: str, **options) -> dict:
    """Totals over ``prompts`` decoded one at a time: seconds, prefill, drafter, steps, tokens."""
    drafter = make_drafter(drafter_name, **options)
    generate(loaded, prompts[:1], drafter=drafter, max_new_tokens=8)  # warm-up
    total = dict(seconds=0.0, prefill=0.0, drafter=0.0, steps=0, new=0)
    for prompt in prompts:
        stats = generate(loaded, [prompt], drafter=drafter, max_new_tokens=64).stats
        total["seconds"] += stats.seconds
        total["prefill"] += stats.prefill_seconds
        total["drafter"] += stats.drafter_seconds
        total["steps"] += stats.target_forwards
        total["new"] += stats.new_tokens
    report = (drafter.report() if drafter is not None else None) or {}  # the drafter's life
    total["nodes"] = report.get("tree_nodes_per_step") or 0.0
    total["forwards"] = report.get("draft_forwards_per_step") or 0.0
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eagle", action="append", type=json.loads, default=None,
                        help="EAGLE options as JSON (repeatable)")
    args = parser.parse_args(argv)
    loaded = load_model("default", weights="float32")
    prompts = [p["turns"][0] for p in load_prompts()][:240:40]
    runs = [("none", {})] + [("eagle", options) for options in (args.eagle or [{}])]
    for name, options in runs:
        t = step_split(loaded, prompts, name, **options)
        decode_ms = 1e3 * (t["seconds"] - t["prefill"]) / t["steps"]
        drafter_ms = 1e3 * t["drafter"] / t["steps"]
        print(f"{name} {json.dumps(options)}: tau {t['new'] / t['steps']:.2f}, decode "
              f"{decode_ms:.1f} ms/step (drafter {drafter_ms:.1f}, the rest "
              f"{decode_ms - drafter_ms:.1f}), {t['new'] / t['seconds']:.1f} tokens/s, "
              f"{t['nodes']:.1f} drafted nodes and {t['forwards']:.2f} draft forwards a step")


if __name__ == "__main__":
    main()
