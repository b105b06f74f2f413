"""Every microbenchmark, then one Markdown table.

    python3 -m bench [--out DIR] [--isa avx2] [pytest options, e.g. -k cuda --benchmark-max-time=0.5]

Runs every ``bench/bench_*.py`` with pytest-benchmark, keeps its JSON as ``DIR/microbench.json`` and
writes the table (``bench.summarize``) to ``DIR/microbench.md`` and standard output.
"""

import argparse
import sys
from pathlib import Path

import pytest

from bench import summarize
from specdec_kernels.bench import machine


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__)
    parser.add_argument("--out", default="bench_results", help="output folder")
    parser.add_argument("--isa", choices=machine.ISA_CHOICES,
                        help="run the CPU kernels (the package's and torch's) at this "
                        "instruction set (see specdec_kernels.bench.machine.cap_isa)")
    args, pytest_args = parser.parse_known_args(argv)
    machine.cap_isa(args.isa)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "microbench.json"
    # Named one by one: pytest collects only test_*.py files from a folder.
    files = sorted(str(f) for f in Path(__file__).parent.glob("bench_*.py"))
    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", *files, f"--benchmark-json={report}", *pytest_args]
    )
    if report.is_file() and report.stat().st_size:
        table = summarize.markdown(summarize.load(report))
        (out / "microbench.md").write_text(table)
        sys.stdout.write(table)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
