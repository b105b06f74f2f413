"""Lookahead decoding's (W, N, G) from measured acceptance and a measured step-cost curve.

Acceptance is a property of the model and the method; step cost one of the device. ``measure``
runs :class:`~specdec_kernels.decoding.LookaheadDrafter` greedily over a grid of (W, N, G) on
this module's own tuning prompts (not the benchmark's), and records per configuration the
tokens emitted, the decoding steps and how many steps ran each block width (tree nodes plus
window rows, per request). ``select`` combines that table with a ``bench.cost_curve`` JSON:

    estimated speedup over plain decoding = tokens * c(1) / sum over steps of c(width)

and picks the configuration with the largest one. The package's defaults
(``specdec_kernels.decoding.lookahead.DEFAULTS``) are ``select``'s output for the committed
table and curves; ``python_tests/test_lookahead_defaults.py`` re-derives them, so a new curve
(e.g. after a faster small-batch linear kernel) changes the defaults by re-running ``select``:

    python3 -m bench.lookahead_defaults measure --out lookahead-acceptance.json
    python3 -m bench.lookahead_defaults select --table lookahead-acceptance.json \\
        --curve curve-cpu.json [--model 135m]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from bench.projection import interpolate, mean_step_cost

# Written for tuning (the benchmark's prompts are never used to choose defaults): one or two
# per Spec-Bench category, short and long.
TUNING_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Give me three tips to keep a small vegetable garden healthy during a dry summer.",
    "Translate to English: 'Le train de sept heures est parti en retard parce qu'il neigeait "
    "sur toute la région, et les voyageurs ont attendu longtemps sur le quai.'",
    "Summarize the following text in three sentences.\n\nThe town of Millbrook built its first "
    "public library in 1902 with money raised by a bake sale, a concert and a donation from "
    "a local miller. The library began with four hundred books kept in a single room above "
    "the post office. In 1958 it moved to a brick building on Main Street, where it added a "
    "children's room and a small collection of records. During the 1990s the library "
    "installed its first computers and started offering free classes on how to use the "
    "internet. Today it lends books, films and tools, hosts a weekly chess club and runs a "
    "summer reading program that more than six hundred children joined last year.",
    "What causes the seasons on Earth?",
    "Who painted the ceiling of the Sistine Chapel, and how long did it take?",
    "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Explain your steps.",
    "Answer the question using the passage.\n\nPassage: The Rhine is a river that begins in "
    "the Swiss Alps and flows north through Germany and the Netherlands before reaching the "
    "North Sea. It is about 1,230 kilometres long. Barges carry coal, grain and containers "
    "along the river, which links major industrial cities such as Basel, Cologne and "
    "Duisburg. Its valley between Bingen and Bonn is known for castles and vineyards.\n\n"
    "Question: Which countries does the Rhine flow through, and what do barges carry?",
]

#: The grid ``measure`` runs by default: (window W, n-gram N, candidates G), from narrow blocks
#: (what a CPU affords) to the reference implementation's setting for 7B models on an A100
#: (15, 5, 15); about an hour on a quiet 2-core CPU.
GRID = [
    (1, 3, 2), (2, 3, 2), (4, 3, 2), (4, 3, 4), (8, 3, 4),
    (2, 4, 2), (4, 4, 2), (4, 4, 4), (8, 4, 4), (4, 4, 8),
    (2, 5, 2), (4, 5, 4), (8, 5, 4), (8, 5, 8), (15, 5, 15),
]


class _WidthRecorder:
    """Delegates to a drafter and counts each request's block width per step (tree nodes plus
    window rows, padding excluded: the width the request would run alone)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.widths: Counter = Counter()

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def propose(self, state):
        proposal = self.inner.propose(state)
        width = (proposal.parents != -2).sum(1)
        if proposal.extra is not None:
            width = width + (proposal.extra.positions >= 0).sum(1)
        self.widths.update(width.tolist())
        return proposal


def measure(grid, max_new_tokens: int, batch_size: int, progress=print) -> dict:
    """Greedy runs of every configuration of ``grid`` over :data:`TUNING_PROMPTS`."""
    import torch

    from specdec_kernels.decoding import LookaheadDrafter, generate
    from specdec_kernels.models import encode_prompts, load_model

    loaded = load_model("default", dtype="float32")
    prompts = encode_prompts(loaded.tokenizer, TUNING_PROMPTS)
    rows = []
    for window, ngram, candidates in grid:
        start = time.perf_counter()
        recorder = _WidthRecorder(LookaheadDrafter(window, ngram, candidates))
        tokens = steps = 0
        for i in range(0, len(prompts), batch_size):
            out = generate(loaded, prompts[i : i + batch_size], drafter=recorder,
                           max_new_tokens=max_new_tokens)
            tokens += out.stats.new_tokens
            steps += sum(r.target_forwards for r in out.stats.requests)
        rows.append({
            "window": window, "ngram": ngram, "max_candidates": candidates,
            "tokens": tokens, "steps": steps,
            "widths": {str(w): n for w, n in sorted(recorder.widths.items())},
        })
        progress(f"W={window} N={ngram} G={candidates}: tokens/step {tokens / steps:.3f} "
                 f"({time.perf_counter() - start:.0f} s)", flush=True)
    return {
        "model": "default (SmolLM2-135M-Instruct, float32)",
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "configs": rows,
    }


def estimated_speedup(row: dict, latencies: dict) -> float:
    """tokens * c(1) / sum of c(width) over the row's steps (plain decoding = 1)."""
    steps = sum(row["widths"].values())
    mean_cost = mean_step_cost(latencies, row["widths"], 0.0)
    return row["tokens"] * interpolate(latencies, 1) / (mean_cost * steps)


def ranked(table: dict, curve: dict, model: str = "135m") -> list:
    """Every configuration of ``table`` with its estimated speedup on ``curve``, best first
    (ties: the narrower block)."""
    latencies = curve["models"][model]["latency_ms"]
    largest = max(int(t) for t in latencies)
    out = []
    for row in table["configs"]:
        widest = max(int(w) for w in row["widths"])
        if widest > largest:
            raise ValueError(
                f"W={row['window']} N={row['ngram']} G={row['max_candidates']} ran blocks of "
                f"{widest} tokens; the curve stops at {largest}: measure it further"
            )
        mean_width = sum(int(w) * n for w, n in row["widths"].items()) / row["steps"]
        out.append({
            "window": row["window"], "ngram": row["ngram"],
            "max_candidates": row["max_candidates"],
            "tokens_per_step": row["tokens"] / row["steps"],
            "mean_width": mean_width,
            "speedup": estimated_speedup(row, latencies),
        })
    out.sort(key=lambda r: (-round(r["speedup"], 6), r["mean_width"]))
    return out


def select(table: dict, curve: dict, model: str = "135m") -> dict:
    """The (W, N, G) with the largest estimated speedup, as ``LookaheadDrafter`` kwargs."""
    best = ranked(table, curve, model)[0]
    return {k: best[k] for k in ("window", "ngram", "max_candidates")}


def flat_curve(table: dict, model: str = "135m") -> dict:
    """A step cost that does not grow with the block width up to the widest block of
    ``table``: the stand-in for a GPU until one's curve is measured (a 135M-parameter model's
    forward on a data-centre GPU is bound by kernel launches, not by the tokens it runs)."""
    widest = max(int(w) for row in table["configs"] for w in row["widths"])
    return {
        "device": "assumed GPU: flat step cost (not measured)", "dtype": "bfloat16",
        "prefix": 0, "models": {model: {"latency_ms": {"1": 1.0, str(widest): 1.0}}},
    }


def markdown(rows: list, curve: dict, limit: int = 12) -> str:
    lines = [
        f"Estimated on {curve['device']} ({curve['dtype']}, prefix {curve['prefix']}):",
        "",
        "| W | N | G | tokens/step | mean block width | estimated speedup |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows[:limit]:
        lines.append(f"| {r['window']} | {r['ngram']} | {r['max_candidates']} | "
                     f"{r['tokens_per_step']:.3f} | {r['mean_width']:.1f} | {r['speedup']:.2f}× |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="acceptance table of the grid (greedy, default model)")
    m.add_argument("--out", required=True)
    m.add_argument("--max-new-tokens", type=int, default=64)
    m.add_argument("--batch-size", type=int, default=8)
    m.add_argument("--grid", help="semicolon list of W,N,G (default: the module's GRID)")
    m.add_argument("--threads", type=int, help="torch CPU threads (acceptance needs no timing)")
    s = sub.add_parser("select", help="best (W, N, G) for a cost curve")
    s.add_argument("--table", required=True)
    s.add_argument("--curve", help="bench.cost_curve JSON")
    s.add_argument("--flat", action="store_true", help="assume a flat curve (no GPU measured)")
    s.add_argument("--model", default="135m")
    args = parser.parse_args(argv)
    if args.command == "measure":
        grid = GRID
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        if args.grid:
            grid = [tuple(int(v) for v in item.split(",")) for item in args.grid.split(";")]
        table = measure(grid, args.max_new_tokens, args.batch_size)
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)
        return
    with open(args.table) as f:
        table = json.load(f)
    if args.flat == bool(args.curve):
        parser.error("select needs exactly one of --curve and --flat")
    if args.flat:
        curve = flat_curve(table, args.model)
    else:
        with open(args.curve) as f:
            curve = json.load(f)
    rows = ranked(table, curve, args.model)
    print(markdown(rows, curve))
    print("best:", select(table, curve, args.model))


if __name__ == "__main__":
    main()
