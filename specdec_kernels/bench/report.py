"""Aggregate benchmark measurements into per-method, per-category figures; write JSON,
Markdown and PNG plots."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from specdec_kernels.bench.machine import machine_line
from specdec_kernels.bench.methods import BASELINE, METHOD_DESCRIPTIONS
from specdec_kernels.bench.prompts import CATEGORIES

OVERALL = "overall"

#: A run is flagged as an outlier when its relative cost (below) is more than this many times
#: its method's median. Legitimate differences between prompts stay well inside it (a method's
#: speedup varies ~2x between categories); the stalls it catches cost 10x (a prompt of ~3 s
#: that took ~40 s while the machine was busy).
OUTLIER_FACTOR = 3.0


def _cell(m) -> tuple:
    """The group of prompts and the repeat a run belongs to: every method runs each cell
    once, back to back (interleaved)."""
    return (m.question_ids, m.repeat)


def find_outliers(measurements, factor: float = OUTLIER_FACTOR) -> dict:
    """The runs far from their method's others: ``{(method, question_ids, repeat): how many
    times its method's usual relative cost}``.

    A run's relative cost is its seconds per new token over the median seconds per new token
    of every method on the same cell (same prompts, same repeat, run back to back), which
    takes out how long the prompts are. A run is an outlier when its relative cost exceeds
    ``factor`` times the median of its method's relative costs over all cells. Works from one
    repeat on (the other prompts are the comparison); needs at least 3 cells per method.
    """
    per_token = {}
    cells = defaultdict(list)
    for m in measurements:
        if m.record.new_tokens > 0 and m.record.seconds > 0:
            cost = m.record.seconds / m.record.new_tokens
            per_token[(m.method, *_cell(m))] = cost
            cells[_cell(m)].append(cost)
    typical = {cell: statistics.median(costs) for cell, costs in cells.items()}
    relative = defaultdict(dict)
    for (method, *cell), cost in per_token.items():
        relative[method][tuple(cell)] = cost / typical[tuple(cell)]
    flagged = {}
    for method, by_cell in relative.items():
        if len(by_cell) < 3:
            continue
        usual = statistics.median(by_cell.values())
        flagged.update({(method, *cell): r / usual for cell, r in by_cell.items()
                        if r > factor * usual})
    return flagged


def _rate(runs) -> float:
    seconds = sum(m.record.seconds for m in runs)
    return sum(m.record.new_tokens for m in runs) / seconds if seconds > 0 else 0.0


def summarize(measurements, outliers: dict | None = None) -> dict:
    """Figures per method and category (plus ``overall``).

    Tokens/s is total new tokens over total seconds of a repeat; its median and range are
    taken over repeats. Speedup is the median tokens/s over the baseline's, same category;
    its range (``speedup_min`` / ``speedup_max``) is that of the per-repeat ratios (each
    repeat against the baseline's same repeat); ``run_speedup_min`` / ``_max`` is the range
    of single runs (each prompt group and repeat against the baseline's). tau is new tokens
    per request per target forward (the prefill included); acceptance per draft depth is
    accepted / proposed, None at depths never proposed.

    ``outliers`` (see :func:`find_outliers`) are left out: a flagged run, and for a method's
    speedup the baseline's run of the same cell too (and every method's run of a cell where
    the baseline's is flagged), so a speedup always compares the same prompts.
    """
    outliers = outliers or {}
    base_flagged = {(ids, repeat) for method, ids, repeat in outliers if method == BASELINE}
    groups = defaultdict(list)
    for m in measurements:
        if (m.method, *_cell(m)) in outliers or _cell(m) in base_flagged:
            continue
        groups[(m.method, m.category)].append(m)
        groups[(m.method, OVERALL)].append(m)
    baseline_runs = {_cell(m): m for m in measurements if m.method == BASELINE}
    figures = {}
    for (method, category), runs in groups.items():
        by_repeat = defaultdict(list)
        for m in runs:
            by_repeat[m.repeat].append(m)
        rates = [_rate(r) for r in by_repeat.values()]
        rate_by_repeat = {repeat: _rate(r) for repeat, r in by_repeat.items()}
        # The baseline on exactly these runs' prompts (some may be left out as outliers).
        base_by_repeat = {
            repeat: _rate(same)
            for repeat, r in by_repeat.items()
            if (same := [baseline_runs[_cell(m)] for m in r if _cell(m) in baseline_runs])
        }
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
            "_base_by_repeat": base_by_repeat,
            "_run_ratios": [
                (m.record.new_tokens / m.record.seconds)
                / (b.record.new_tokens / b.record.seconds)
                for m in runs
                if (b := baseline_runs.get(_cell(m))) is not None
                and min(m.record.seconds, b.record.seconds, b.record.new_tokens) > 0
            ],
        }
    for per_category in figures.values():
        for row in per_category.values():
            base, rates = row.pop("_base_by_repeat"), row.pop("_rate_by_repeat")
            positive = [rate for rate in base.values() if rate > 0]
            row["speedup"] = (
                row["tokens_per_second"] / statistics.median(positive) if positive else None
            )
            ratios = [rate / base[r] for r, rate in rates.items() if base.get(r, 0) > 0]
            row["speedup_min"] = min(ratios) if ratios else None
            row["speedup_max"] = max(ratios) if ratios else None
            run_ratios = row.pop("_run_ratios")
            row["run_speedup_min"] = min(run_ratios) if run_ratios else None
            row["run_speedup_max"] = max(run_ratios) if run_ratios else None
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
    """The dev set's categories in report order, then any other (a workload's own), sorted."""
    present = {c for per in figures.values() for c in per} - {OVERALL}
    return [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))


def _kernels_note(kernels) -> str:
    """``, ours on the package kernels (avx2)`` from the run's kernel choice, if recorded."""
    if not isinstance(kernels, dict) or kernels.get("isa", "-") == "-":
        return ""
    gemm = kernels.get("prefill_gemm_rows")
    prefill = f", prefill linears of >= {gemm} rows on torch's GEMM" if gemm else ""
    return f", ours on the {kernels['path']} kernels ({kernels['isa']}{prefill})"


def _flagged_lines(outliers: list) -> list:
    """The flagged runs (see :func:`find_outliers`) as a Markdown table."""
    if not outliers:
        return []
    lines = [
        "",
        f"Flagged runs, left out of every figure above (each cost more than {OUTLIER_FACTOR:g}× "
        "its method's usual share of the same prompts' time; the baseline's run of those "
        "prompts is left out of that method's speedup too):",
        "",
        "| method | questions | category | repeat | seconds | tokens/s | × usual cost |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for o in outliers:
        lines.append(
            f"| {o['method']} | {', '.join(map(str, o['question_ids']))} | {o['category']} | "
            f"{o['repeat']} | {o['seconds']:.1f} | {o['tokens_per_second']:.1f} | "
            f"{o['times_usual']:.1f} |"
        )
    return lines


def markdown(figures: dict, config: dict, outliers: list = ()) -> str:
    """The overall table, flagged runs, the per-category speedup table and acceptance by
    draft depth."""
    lines = [
        f"Target: {config['target']}, {config['device']} {config['dtype']}, "
        f"{config['prompts']} prompts, {config['max_new_tokens']} new tokens, "
        f"{config['repeats']} repeat(s), batch size {config.get('batch_size', 1)}, "
        + ("greedy" if config["temperature"] == 0 else f"sampling T={config['temperature']}")
        + _kernels_note(config.get("cpu_kernels"))
        + f", {config.get('date', 'undated')}. Command: `{config['command']}`",
        "",
        machine_line(config),
        "",
        "| method | tokens/s (median [min–max]) | speedup vs HF generate | speedup of single "
        "runs (min–max) | τ | drafter time | output identical to HF generate |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for method in _methods_in_order(figures):
        row = figures[method].get(OVERALL)
        if row is None:  # every run flagged
            lines.append(f"| {method} | — | — | — | — | — | — |")
            continue
        rate = (
            f"{row['tokens_per_second']:.1f} [{row['tokens_per_second_min']:.1f}–"
            f"{row['tokens_per_second_max']:.1f}]"
        )
        spread = (
            "—" if row["run_speedup_min"] is None
            else f"{row['run_speedup_min']:.2f}–{row['run_speedup_max']:.2f}×"
        )
        lines.append(
            f"| {method} | {rate} | {_fmt(row['speedup'], '.2f')}× | {spread} | "
            f"{_fmt(row['tau'], '.2f')} | {_fmt(row['drafter_time_share'], '.0%')} | "
            f"{_fmt(row['identical'], '.0%', 'n/a')} |"
        )
    lines += _flagged_lines(list(outliers))
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


#: Hatches and markers that, with the 20 colours of matplotlib's ``tab20``, keep every method
#: of a plot distinct (a colour repeats only past 20 methods, then with another hatch).
_HATCHES = ("", "//", "..", "xx")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p", "d", "H", "8")


def method_styles(methods: list) -> dict:
    """``{method: {"color", "hatch", "marker"}}``: no two methods share all three, and no two
    of the first 20 share a colour. Colours follow the method's place in
    :data:`METHOD_DESCRIPTIONS`, so a method keeps its colour from one report to the next."""
    import matplotlib

    palette = matplotlib.colormaps["tab20"].colors
    order = list(METHOD_DESCRIPTIONS) + [m for m in methods if m not in METHOD_DESCRIPTIONS]
    styles = {}
    for method in methods:
        i = order.index(method)
        styles[method] = {
            "color": palette[i % len(palette)],
            "hatch": _HATCHES[(i // len(palette)) % len(_HATCHES)],
            "marker": _MARKERS[i % len(_MARKERS)],
        }
    return styles


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
    styles = method_styles(list(bars))
    fig, ax = plt.subplots(figsize=(max(10, 1.6 * len(categories)), 5))
    width = 0.8 / max(len(bars), 1)
    for i, (method, (values, lows, highs)) in enumerate(bars.items()):
        x = [j + i * width for j in range(len(categories))]
        heights = [v or 0.0 for v in values]
        style = {"label": method, "color": styles[method]["color"],
                 "hatch": styles[method]["hatch"], "edgecolor": "white", "linewidth": 0}
        if runs > 1:
            known = [None not in t for t in zip(values, lows, highs)]
            spread = [
                [v - lo if k else 0.0 for v, lo, k in zip(values, lows, known)],
                [hi - v if k else 0.0 for v, hi, k in zip(values, highs, known)],
            ]
            ax.bar(x, heights, width, yerr=spread, capsize=2, error_kw={"elinewidth": 0.8},
                   **style)
        else:
            ax.bar(x, heights, width, **style)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(bars) - 1) / 2 for j in range(len(categories))])
    ax.set_xticklabels(categories, rotation=20)
    ax.set_ylabel("speedup vs HF generate (tokens/s ratio)")
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if runs > 1:
        ax.set_title(f"Speedup by category (median of {runs} runs, whiskers: min–max)")
    else:
        ax.set_title("Speedup by category (1 run: no spread measured)")
    fig.tight_layout()
    return fig


def acceptance_figure(figures: dict):
    """The matplotlib figure of ``acceptance.png`` (see :func:`acceptance_series`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = acceptance_series(figures)
    styles = method_styles(list(series))
    for method, (depths, rates) in series.items():
        ax.plot(depths, rates, marker=styles[method]["marker"], color=styles[method]["color"],
                label=method)
    ax.set_xlabel("draft depth (depths never proposed left out)")
    ax.set_ylabel("acceptance rate (accepted / proposed)")
    ax.set_ylim(0, 1.05)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Acceptance by draft position")
    fig.tight_layout()
    return fig


def plot(figures: dict, out_dir: Path, machine: str = "") -> list:
    """Speedup by category and method; acceptance by draft position, each with ``machine``
    (:func:`~specdec_kernels.bench.machine.machine_line`) as a footnote. Returns the files."""
    plt = _pyplot()

    files = []
    for name, make in (("speedup.png", speedup_figure), ("acceptance.png", acceptance_figure)):
        fig = make(figures)
        if machine:
            fig.text(0.01, 0.005, machine, fontsize=6.5, ha="left", va="bottom")
            fig.tight_layout(rect=(0, 0.04, 1, 1))
        files.append(out_dir / name)
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)
    return files


def describe_outliers(measurements, outliers: dict) -> list:
    """The flagged runs as dicts (method, questions, category, repeat, seconds, tokens/s,
    times its method's usual relative cost), in run order."""
    found = []
    for m in measurements:
        factor = outliers.get((m.method, *_cell(m)))
        if factor is not None:
            found.append({
                "method": m.method, "question_ids": list(m.question_ids),
                "category": m.category, "repeat": m.repeat, "seconds": m.record.seconds,
                "tokens_per_second": m.record.new_tokens / m.record.seconds,
                "times_usual": factor,
            })
    return found


def series_markdown(measurements, figures: dict) -> str:
    """For a series of requests (the repeated-task workload: question ids are positions in
    the series): each method's τ at every position (mean over repeats), and its tokens/s over
    our plain loop's (``ours-autoregressive``) in each half of the series."""
    tau = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        forwards = sum(m.record.forward_rows)
        if forwards:
            tau[m.method][m.question_ids[0]].append(m.record.new_tokens / forwards)
    positions = sorted({q for per in tau.values() for q in per})
    lines = ["", "τ by position in the series (requests run one after another):", "",
             "| method | " + " | ".join(str(q) for q in positions) + " |",
             "|---|" + "---:|" * len(positions)]
    for method in _methods_in_order(figures):
        cells = [f"{statistics.fmean(tau[method][q]):.2f}" if tau[method][q] else "—"
                 for q in positions]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    plain = figures.get("ours-autoregressive")
    if plain:
        halves = [c for c in _categories_in_order(figures) if c in plain]
        lines += ["", "Tokens/s over ours-autoregressive's, by half of the series:", "",
                  "| method | " + " | ".join(halves) + " |", "|---|" + "---:|" * len(halves)]
        for method in _methods_in_order(figures):
            cells = []
            for half in halves:
                row, base = figures[method].get(half), plain[half]["tokens_per_second"]
                cells.append("—" if row is None or not base
                             else f"{row['tokens_per_second'] / base:.2f}×")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_reports(measurements, config: dict, out_dir: Path) -> dict:
    """Write results.json, results.md and the plots into ``out_dir``; return the figures
    (outlier runs flagged and left out, see :func:`find_outliers`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outliers = find_outliers(measurements)
    figures = summarize(measurements, outliers)
    flagged = describe_outliers(measurements, outliers)
    runs = []
    for m in measurements:
        runs.append({**m.to_dict(), "outlier": (m.method, *_cell(m)) in outliers})
    with open(out_dir / "results.json", "w") as f:
        json.dump(
            {"config": config, "figures": figures, "outliers": flagged, "measurements": runs},
            f,
            indent=1,
        )
    text = markdown(figures, config, flagged)
    if config.get("workload") == "repeated-task":
        text += series_markdown(measurements, figures)
    (out_dir / "results.md").write_text(text)
    left_out = f"; {len(flagged)} flagged run(s) left out (results.md)" if flagged else ""
    plot(figures, out_dir, machine_line(config) + left_out)
    return figures
