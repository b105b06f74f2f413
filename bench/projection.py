"""Project end-to-end speedups on another device from acceptance measured here.

Acceptance (tau: tokens per verification step; how wide each step is; how deep the drafter
drafts) is a property of the models and the method, measured by ``specdec bench`` on any
machine. Step cost is a property of the hardware, measured by ``bench.cost_curve`` on the
device of interest. Their combination, for each method:

    projected speedup = tau * c(1) / (mean c(W) + draft cost per step)

where c(T) is the target's forward latency over T tokens through the engine, W the tokens
verified in a step
(averaged over the steps' recorded widths),
and the draft cost is D draft forwards of the first L of N layers, about D * (L / N) * c(1),
for layer-skip drafting, the host time measured per step for prompt lookup, lookahead and
Jacobi decoding (whose window rows are part of W), and ``head_cost_fraction * c(1)`` for
drafters that report it (Medusa and blockwise heads: their weights over the target's). Methods whose
draft cost cannot be derived (a separate draft model without its own curve, HF's early exit)
are listed without a projection. When the curve also holds torch's own path (what HF
``generate`` runs), the speedup over HF ``generate`` is projected too: the same with
c_torch(1) in the numerator.

    python3 -m bench.projection --curve curve-h100.json --model 135m \\
        --results bench_results/results.json [--out projection.md]
"""

from __future__ import annotations

import argparse
import json

from specdec_kernels.decoding.cost import StepCost


def interpolate(curve: dict, width: float) -> float:
    """c(width) from measured points {T: ms}, linear between neighbours, clamped at the ends."""
    return StepCost(curve)(width)


def mean_step_cost(latencies: dict, width_counts: dict | None, mean_width: float) -> float:
    """Mean c(W) over the verification steps: from the steps' widths when recorded (the cost
    is far from linear in W, so c(mean W) would misjudge a mix of narrow and wide steps),
    else c(mean W)."""
    if not width_counts:
        return interpolate(latencies, mean_width)
    steps = sum(width_counts.values())
    return sum(n * interpolate(latencies, int(w)) for w, n in width_counts.items()) / steps


def draft_cost_ms(method: str, row: dict, settings: dict, c1: float, depth: int) -> float | None:
    """Draft time per step on the projected device, or None when it cannot be derived."""
    if method == "ours-autoregressive" or method == "hf-generate":
        return 0.0
    if settings.get("head_cost_fraction") is not None:
        return settings["head_cost_fraction"] * c1
    if method.endswith("prompt-lookup") or method in ("ours-lookahead", "ours-jacobi"):
        # Host-side n-gram matching (lookahead's and Jacobi's guesses run inside the
        # verification forward, counted in its width): the measured host time carries over.
        if row.get("drafter_seconds_per_step") is not None:
            return 1e3 * row["drafter_seconds_per_step"]
        return 0.0
    if method == "ours-self-speculative" and row.get("drafted_depth_per_step") is not None:
        layers = settings.get("num_layers")
        if layers:
            return row["drafted_depth_per_step"] * layers / depth * c1
    return None


def project(results: dict, curve: dict, model: str) -> list:
    """Rows of (method, inputs, projected speedup) for every method of a harness run."""
    latencies = curve["models"][model]["latency_ms"]
    c1 = interpolate(latencies, 1)
    torch_curve = curve["models"][model].get("torch_latency_ms")
    hf_c1 = interpolate(torch_curve, 1) if torch_curve else None
    depth = results["config"].get("target_layers") or curve["models"][model].get("layers")
    rows = []
    for method, per_category in results["figures"].items():
        row = per_category["overall"]
        width, tau = row.get("verify_width"), row.get("tokens_per_step")
        settings = results["config"].get("method_settings", {}).get(method, {})
        if width is None or tau is None:
            continue
        step = mean_step_cost(latencies, row.get("verify_width_counts"), width)
        draft = draft_cost_ms(method, row, settings, c1, depth or 1)
        rows.append({
            "method": method,
            "tau": tau,
            "verify_width": width,
            "step_ms": step,
            "draft_ms": draft,
            "projected_speedup": None if draft is None else tau * c1 / (step + draft),
            "projected_vs_hf": None if draft is None or hf_c1 is None else tau * hf_c1 / (step + draft),
            "measured_speedup_here": row.get("speedup"),
        })
    return rows


def markdown(rows: list, curve: dict, model: str, results: dict) -> str:
    shape = curve["models"][model]
    c1 = interpolate(shape["latency_ms"], 1)
    torch_c1 = (f"; HF's own c(1) = {interpolate(shape['torch_latency_ms'], 1):.2f} ms"
                if shape.get("torch_latency_ms") else "")
    fmt = lambda v: "—" if v is None else f"{v:.2f}×"  # noqa: E731
    lines = [
        f"Projection for the {model} shape on {curve['device']} ({curve['dtype']}, prefix "
        f"{curve['prefix']}; engine c(1) = {c1:.2f} ms{torch_c1}), from acceptance measured on "
        f"{results['config']['device']} with target {results['config']['target']}. "
        "A projection, not a measurement: speedup = τ·c(1) / (mean c(W) + draft).",
        "",
        "| method | τ (tokens/step) | mean W (tokens verified/step) | mean c(W) ms | draft ms/step | "
        "projected vs plain decoding | projected vs HF generate | measured here vs HF generate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        draft = "—" if r["draft_ms"] is None else f"{r['draft_ms']:.2f}"
        lines.append(
            f"| {r['method']} | {r['tau']:.2f} | {r['verify_width']:.1f} | {r['step_ms']:.2f} | "
            f"{draft} | {fmt(r['projected_speedup'])} | {fmt(r.get('projected_vs_hf'))} | "
            f"{fmt(r['measured_speedup_here'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curve", required=True, help="JSON from bench.cost_curve")
    parser.add_argument("--model", default="135m", help="model shape in the curve")
    parser.add_argument("--results", required=True, help="results.json from specdec bench")
    parser.add_argument("--out", help="write the Markdown table here too")
    args = parser.parse_args(argv)
    with open(args.curve) as f:
        curve = json.load(f)
    with open(args.results) as f:
        results = json.load(f)
    if args.model not in curve["models"]:
        raise SystemExit(f"{args.model!r} is not in {args.curve} (has {sorted(curve['models'])})")
    text = markdown(project(results, curve, args.model), curve, args.model, results)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
