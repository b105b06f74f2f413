"""Aggregate benchmark measurements into per-method, per-category figures; write JSON,
Markdown and PNG plots."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from specdec_kernels.bench.methods import BASELINE, METHOD_DESCRIPTIONS
from specdec_kernels.bench.prompts import CATEGORIES

OVERALL = "overall"


def _rate(runs) -> float:
    seconds = sum(m.record.seconds for m in runs)
    return sum(m.record.new_tokens for m in runs) / seconds if seconds > 0 else 0.0


def summarize(measurements) -> dict:
    """Figures per method and category (plus ``overall``).

    Tokens/s is total new tokens over total seconds of a repeat; its median and range are
    taken over repeats. Speedup is the median tokens/s over the baseline's, same category.
    tau is new tokens per request per target forward (the prefill included); acceptance per
    draft depth is accepted / proposed.
    """
    groups = defaultdict(list)
    for m in measurements:
        groups[(m.method, m.category)].append(m)
        groups[(m.method, OVERALL)].append(m)
    figures = {}
    for (method, category), runs in groups.items():
        by_repeat = defaultdict(list)
        for m in runs:
            by_repeat[m.repeat].append(m)
        rates = [_rate(r) for r in by_repeat.values()]
        request_forwards = sum(sum(m.record.forward_rows) for m in runs)
        tokens = sum(m.record.new_tokens for m in runs)
        seconds = sum(m.record.seconds for m in runs)
        drafter = [m.record.drafter_seconds for m in runs]
        proposed, accepted = _columns(runs, "proposed_at"), _columns(runs, "accepted_at")
        identical = [m.identical for m in runs if m.identical is not None]
        # Decoding steps only (the prefill forward left out, and the token it yields for HF).
        step_widths = [w for m in runs for w in m.record.forward_widths[1:]]
        step_tokens = sum(
            max(len(t) - m.record.first_token_from_prefill, 0)
            for m in runs
            for t in m.record.tokens
        )
        step_rows = sum(sum(m.record.forward_rows[1:]) for m in runs)
        figures.setdefault(method, {})[category] = {
            "prompts": len({i for m in runs for i in m.question_ids}),
            "new_tokens": tokens,
            "tokens_per_second": statistics.median(rates),
            "tokens_per_second_min": min(rates),
            "tokens_per_second_max": max(rates),
            "tau": tokens / request_forwards if request_forwards else None,
            "drafter_time_share": (
                sum(drafter) / seconds if None not in drafter and seconds > 0 else None
            ),
            "acceptance_at": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
            "steps": len(step_widths),
            "drafter_seconds_per_step": (
                sum(drafter) / len(step_widths) if None not in drafter and step_widths else None
            ),
            "tokens_per_step": step_tokens / step_rows if step_rows else None,
            "verify_width": statistics.fmean(step_widths) if step_widths else None,
            # How many steps verified each width: a step's cost is not linear in its width.
            "verify_width_counts": {str(w): n for w, n in sorted(Counter(step_widths).items())},
            # sum over depths of "steps that drafted this deep": the draft forwards of a chain
            # drafter, per step.
            "drafted_depth_per_step": (
                sum(proposed) / step_rows if proposed and step_rows else None
            ),
            "identical": (sum(identical) / len(identical)) if identical else None,
        }
    for method, per_category in figures.items():
        for category, row in per_category.items():
            base = figures.get(BASELINE, {}).get(category)
            row["speedup"] = (
                row["tokens_per_second"] / base["tokens_per_second"]
                if base and base["tokens_per_second"] > 0
                else None
            )
    return figures


def _columns(runs, attribute: str) -> list:
    rows = [getattr(m.record, attribute) for m in runs]
    width = max((len(r) for r in rows), default=0)
    return [sum(r[i] for r in rows if i < len(r)) for i in range(width)]


def _fmt(value, pattern: str, missing: str = "—") -> str:
    return missing if value is None else format(value, pattern)


def _methods_in_order(figures: dict) -> list:
    return [m for m in METHOD_DESCRIPTIONS if m in figures]


def _categories_in_order(figures: dict) -> list:
    present = {c for per in figures.values() for c in per}
    return [c for c in CATEGORIES if c in present]


def markdown(figures: dict, config: dict) -> str:
    """The overall table, the per-category speedup table and acceptance by draft depth."""
    lines = [
        f"Target: {config['target']}, {config['device']} {config['dtype']}, "
        f"{config['prompts']} prompts, {config['max_new_tokens']} new tokens, "
        f"{config['repeats']} repeat(s), batch size {config.get('batch_size', 1)}, "
        + ("greedy" if config["temperature"] == 0 else f"sampling T={config['temperature']}")
        + f". Command: `{config['command']}`",
        "",
        "| method | tokens/s (median [min–max]) | speedup vs HF generate | τ | drafter time | "
        "output identical to HF generate |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for method in _methods_in_order(figures):
        row = figures[method][OVERALL]
        rate = (
            f"{row['tokens_per_second']:.1f} [{row['tokens_per_second_min']:.1f}–"
            f"{row['tokens_per_second_max']:.1f}]"
        )
        lines.append(
            f"| {method} | {rate} | {_fmt(row['speedup'], '.2f')}× | {_fmt(row['tau'], '.2f')} | "
            f"{_fmt(row['drafter_time_share'], '.0%')} | "
            f"{_fmt(row['identical'], '.0%', 'n/a')} |"
        )
    categories = _categories_in_order(figures)
    lines += ["", "Speedup vs HF generate by category (τ in brackets):", ""]
    lines.append("| method | " + " | ".join(categories) + " |")
    lines.append("|---|" + "---:|" * len(categories))
    for method in _methods_in_order(figures):
        cells = []
        for category in categories:
            row = figures[method].get(category)
            cells.append(
                "—" if row is None
                else f"{_fmt(row['speedup'], '.2f')}× ({_fmt(row['tau'], '.2f')})"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    accepting = [m for m in _methods_in_order(figures) if figures[m][OVERALL]["acceptance_at"]]
    if accepting:
        depth = max(len(figures[m][OVERALL]["acceptance_at"]) for m in accepting)
        lines += ["", "Acceptance rate by draft depth (accepted / proposed):", ""]
        lines.append("| method | " + " | ".join(str(d + 1) for d in range(depth)) + " |")
        lines.append("|---|" + "---:|" * depth)
        for method in accepting:
            rates = figures[method][OVERALL]["acceptance_at"]
            cells = [f"{rates[d]:.2f}" if d < len(rates) else "" for d in range(depth)]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(figures: dict, out_dir: Path) -> list:
    """Speedup by category and method; acceptance by draft position. Returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in _methods_in_order(figures) if m != BASELINE]
    categories = _categories_in_order(figures) + [OVERALL]
    files = []

    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(categories)), 4.5))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [
            (figures[method].get(c) or {}).get("speedup") or 0.0 for c in categories
        ]
        ax.bar([j + i * width for j in range(len(categories))], values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(categories))])
    ax.set_xticklabels(categories, rotation=20)
    ax.set_ylabel("speedup vs HF generate (tokens/s ratio)")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("Speedup by category")
    fig.tight_layout()
    files.append(out_dir / "speedup.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in methods:
        rates = figures[method][OVERALL]["acceptance_at"]
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=method)
    ax.set_xlabel("draft depth")
    ax.set_ylabel("acceptance rate (accepted / proposed)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("Acceptance by draft position")
    fig.tight_layout()
    files.append(out_dir / "acceptance.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def write_reports(measurements, config: dict, out_dir: Path) -> dict:
    """Write results.json, results.md and the plots into ``out_dir``; return the figures."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = summarize(measurements)
    with open(out_dir / "results.json", "w") as f:
        json.dump(
            {
                "config": config,
                "figures": figures,
                "measurements": [m.to_dict() for m in measurements],
            },
            f,
            indent=1,
        )
    (out_dir / "results.md").write_text(markdown(figures, config))
    plot(figures, out_dir)
    return figures
