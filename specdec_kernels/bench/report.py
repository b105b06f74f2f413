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
    taken over repeats. Speedup is the median tokens/s over the baseline's, same category;
    its range (``speedup_min`` / ``speedup_max``) is that of the per-repeat ratios (each
    repeat against the baseline's same repeat). tau is new tokens per request per target
    forward (the prefill included); acceptance per draft depth is accepted / proposed, None
    at depths never proposed.
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
        rate_by_repeat = {repeat: _rate(r) for repeat, r in by_repeat.items()}
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
            "repeats": len(by_repeat),
            "new_tokens": tokens,
            "tokens_per_second": statistics.median(rates),
            "tokens_per_second_min": min(rates),
            "tokens_per_second_max": max(rates),
            "tau": tokens / request_forwards if request_forwards else None,
            "drafter_time_share": (
                sum(drafter) / seconds if None not in drafter and seconds > 0 else None
            ),
            "acceptance_at": [a / p if p else None for a, p in zip(accepted, proposed)],
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
            # Steps that verified at least one draft (for lookahead: the pool held an n-gram
            # for the pending token, its pool hit rate) and that accepted at least one.
            "draft_rate": proposed[0] / step_rows if proposed and step_rows else None,
            "accept_rate": accepted[0] / step_rows if accepted and step_rows else None,
            "identical": (sum(identical) / len(identical)) if identical else None,
            "_rate_by_repeat": rate_by_repeat,
        }
    for method, per_category in figures.items():
        for category, row in per_category.items():
            base = figures.get(BASELINE, {}).get(category)
            row["speedup"] = (
                row["tokens_per_second"] / base["tokens_per_second"]
                if base and base["tokens_per_second"] > 0
                else None
            )
            ratios = [
                rate / base["_rate_by_repeat"][repeat]
                for repeat, rate in row["_rate_by_repeat"].items()
                if base and base["_rate_by_repeat"].get(repeat, 0) > 0
            ]
            row["speedup_min"] = min(ratios) if ratios else None
            row["speedup_max"] = max(ratios) if ratios else None
    for per_category in figures.values():
        for row in per_category.values():
            del row["_rate_by_repeat"]
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


def _kernels_note(kernels) -> str:
    """``, ours on the package kernels (avx2)`` from the run's kernel choice, if recorded."""
    if not isinstance(kernels, dict) or kernels.get("isa", "-") == "-":
        return ""
    gemm = kernels.get("prefill_gemm_rows")
    prefill = f", prefill linears of >= {gemm} rows on torch's GEMM" if gemm else ""
    return f", ours on the {kernels['path']} kernels ({kernels['isa']}{prefill})"


def markdown(figures: dict, config: dict) -> str:
    """The overall table, the per-category speedup table and acceptance by draft depth."""
    lines = [
        f"Target: {config['target']}, {config['device']} {config['dtype']}, "
        f"{config['prompts']} prompts, {config['max_new_tokens']} new tokens, "
        f"{config['repeats']} repeat(s), batch size {config.get('batch_size', 1)}, "
        + ("greedy" if config["temperature"] == 0 else f"sampling T={config['temperature']}")
        + _kernels_note(config.get("cpu_kernels"))
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
        lines += [
            "",
            "Tokens per step by category (steps that verified a draft / that accepted one; "
            "for lookahead the first is the pool hit rate):",
            "",
        ]
        lines.append("| method | " + " | ".join(categories + [OVERALL]) + " |")
        lines.append("|---|" + "---:|" * (len(categories) + 1))
        for method in accepting:
            cells = []
            for category in categories + [OVERALL]:
                row = figures[method].get(category)
                cells.append(
                    "—" if row is None
                    else f"{_fmt(row['tokens_per_step'], '.2f')} ({_fmt(row['draft_rate'], '.0%')}"
                    f" / {_fmt(row['accept_rate'], '.0%')})"
                )
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        depth = max(len(figures[m][OVERALL]["acceptance_at"]) for m in accepting)
        lines += ["", "Acceptance rate by draft depth (accepted / proposed):", ""]
        lines.append("| method | " + " | ".join(str(d + 1) for d in range(depth)) + " |")
        lines.append("|---|" + "---:|" * depth)
        for method in accepting:
            rates = figures[method][OVERALL]["acceptance_at"]
            cells = [
                ("" if d >= len(rates) else "—" if rates[d] is None else f"{rates[d]:.2f}")
                for d in range(depth)
            ]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        if any(r is None for m in accepting for r in figures[m][OVERALL]["acceptance_at"]):
            lines += ["", "— : never proposed at that depth."]
    return "\n".join(lines) + "\n"


def speedup_bars(figures: dict) -> tuple:
    """What ``speedup.png`` draws: per method (the baseline left out), per category then
    ``overall``, the median speedup and its min–max range over repeats.

    Returns
    -------
    categories : list of str
    bars : dict of method -> (values, lows, highs)
        Lists over ``categories``; a missing figure is None.
    runs : int
        Repeats behind each bar (the fewest of any bar).
    """
    methods = [m for m in _methods_in_order(figures) if m != BASELINE]
    categories = _categories_in_order(figures) + [OVERALL]
    bars = {}
    for method in methods:
        rows = [figures[method].get(c) or {} for c in categories]
        bars[method] = tuple(
            [row.get(key) for row in rows] for key in ("speedup", "speedup_min", "speedup_max")
        )
    runs = min(
        (row.get("repeats", 1) for m in methods for row in figures[m].values()), default=1
    )
    return categories, bars, runs


def acceptance_series(figures: dict) -> dict:
    """What ``acceptance.png`` draws: per method with acceptance figures, the draft depths
    (1-based) that were proposed at least once and the acceptance rate at each; depths never
    proposed are left out."""
    series = {}
    for method in _methods_in_order(figures):
        if method == BASELINE:
            continue
        rates = figures[method][OVERALL]["acceptance_at"]
        points = [(d + 1, r) for d, r in enumerate(rates) if r is not None]
        if points:
            series[method] = ([d for d, _ in points], [r for _, r in points])
    return series


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup_figure(figures: dict):
    """The matplotlib figure of ``speedup.png`` (see :func:`speedup_bars`): bars with
    min–max whiskers when there are several repeats, otherwise titled as single runs."""
    plt = _pyplot()
    categories, bars, runs = speedup_bars(figures)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(categories)), 4.5))
    width = 0.8 / max(len(bars), 1)
    for i, (method, (values, lows, highs)) in enumerate(bars.items()):
        x = [j + i * width for j in range(len(categories))]
        heights = [v or 0.0 for v in values]
        if runs > 1:
            known = [None not in t for t in zip(values, lows, highs)]
            spread = [
                [v - lo if k else 0.0 for v, lo, k in zip(values, lows, known)],
                [hi - v if k else 0.0 for v, hi, k in zip(values, highs, known)],
            ]
            ax.bar(x, heights, width, label=method, yerr=spread, capsize=2,
                   error_kw={"elinewidth": 0.8})
        else:
            ax.bar(x, heights, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(bars) - 1) / 2 for j in range(len(categories))])
    ax.set_xticklabels(categories, rotation=20)
    ax.set_ylabel("speedup vs HF generate (tokens/s ratio)")
    ax.legend(fontsize=8, ncol=2)
    if runs > 1:
        ax.set_title(f"Speedup by category (median of {runs} runs, whiskers: min–max)")
    else:
        ax.set_title("Speedup by category (1 run: no spread measured)")
    fig.tight_layout()
    return fig


def acceptance_figure(figures: dict):
    """The matplotlib figure of ``acceptance.png`` (see :func:`acceptance_series`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, (depths, rates) in acceptance_series(figures).items():
        ax.plot(depths, rates, marker="o", label=method)
    ax.set_xlabel("draft depth (depths never proposed left out)")
    ax.set_ylabel("acceptance rate (accepted / proposed)")
    ax.set_ylim(0, 1.05)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_title("Acceptance by draft position")
    fig.tight_layout()
    return fig


def plot(figures: dict, out_dir: Path) -> list:
    """Speedup by category and method; acceptance by draft position. Returns the files."""
    plt = _pyplot()

    files = []
    for name, make in (("speedup.png", speedup_figure), ("acceptance.png", acceptance_figure)):
        fig = make(figures)
        files.append(out_dir / name)
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
