"""Turn a pytest-benchmark JSON file into a Markdown table (one row per benchmark).

    python3 -m bench.summarize results.json > table.md
"""

import json
import sys


def _amax_medians(report) -> dict:
    """group -> median of its ``amax`` row (one pass over the same logits), where it has one."""
    return {
        bench.get("group"): bench["stats"]["median"]
        for bench in report["benchmarks"]
        if bench.get("extra_info", {}).get("impl") == "amax"
    }


def rows(report):
    amax = _amax_medians(report)
    for bench in report["benchmarks"]:
        stats = bench["stats"]
        extra = bench.get("extra_info", {})
        shown = {k: v for k, v in extra.items() if k != "bytes"}
        base = amax.get(bench.get("group"))
        yield (
            bench.get("group") or "",
            bench["name"].split("::")[-1],
            f"{stats['median'] * 1e6:,.1f}",
            f"{stats['iqr'] * 1e6:,.1f}",
            str(stats["rounds"]),
            f"{stats['median'] / base:.2f}×" if base else "",
            ", ".join(f"{k} {v}" for k, v in shown.items()),
        )


def markdown(report) -> str:
    machine = report.get("machine_info", {})
    ours = machine.get("specdec", {})
    lines = [
        f"Machine: {machine.get('cpu', {}).get('brand_raw', '?')}, "
        f"{machine.get('python_implementation', '')} {machine.get('python_version', '')}"
        + (f", package kernels on {ours['cpu_isa']}, {ours['threads']} threads, torch "
           f"{ours['torch']} ({ours.get('torch_cpu_capability', '?')})" if ours else ""),
        "",
        "| group | benchmark | median (µs) | IQR (µs) | rounds | × amax | extra |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in sorted(rows(report))]
    return "\n".join(lines) + "\n"


def load(path) -> dict:
    """A pytest-benchmark JSON report."""
    with open(path) as f:
        return json.load(f)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python3 -m bench.summarize BENCHMARK_JSON")
    sys.stdout.write(markdown(load(argv[0])))


if __name__ == "__main__":
    main()
