"""Helpers of scripts/gpu_check.sh: each prints a Markdown fragment for the GPU check's report.

    python3 scripts/gpu_check_report.py env
    python3 scripts/gpu_check_report.py junit RESULTS.xml [LOG]
    python3 scripts/gpu_check_report.py sanitizer LOG
    python3 scripts/gpu_check_report.py resources CUOBJDUMP_OUTPUT
    python3 scripts/gpu_check_report.py ceilings --device cuda --out ceilings.json
    python3 scripts/gpu_check_report.py errors --device cuda

Nothing here decides pass or fail; the shell script does, from exit codes.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from importlib import metadata


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def env() -> str:
    """Device, driver and software versions."""
    import torch

    lines = []
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        l2 = getattr(p, "L2_cache_size", 0) / 2**20
        lines.append(
            f"- device: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
            f"{p.total_memory / 2**30:.0f} GiB, L2 {l2:.0f} MiB"
        )
    else:
        lines.append("- device: none (no GPU visible: dry run on CPU)")
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30,
        ).stdout.strip()
        lines.append(f"- driver, max SM / memory clocks: {smi or 'unknown'}")
    except (OSError, subprocess.TimeoutExpired):
        lines.append("- nvidia-smi: not available")
    try:
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
        release = [ln for ln in nvcc.stdout.splitlines() if "release" in ln]
        lines.append(f"- nvcc: {(release or nvcc.stdout.strip().splitlines())[-1].strip()}")
    except (OSError, subprocess.TimeoutExpired, IndexError):
        lines.append("- nvcc: not found")
    lines.append(
        f"- python {platform.python_version()}, torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}), transformers {_version('transformers')}, "
        f"pytest {_version('pytest')}, pytest-timeout {_version('pytest-timeout')}, "
        f"pytest-benchmark {_version('pytest-benchmark')}"
    )
    return "\n".join(lines) + "\n"


# The failure message of a per-test timeout: pytest-timeout's, or pytest_deadline's fallback.
TIMEOUT = re.compile(r"Timeout \(>[0-9.]+s\) from (?:pytest-timeout|pytest_deadline)")


def _nodeid(case: ET.Element) -> str:
    module = case.get("classname", "").replace(".", "/")
    return f"{module}.py::{case.get('name')}" if module else case.get("name", "?")


def junit(path: str, log: str | None = None) -> str:
    """Counts, failures, skip reasons and the slowest tests of a pytest JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        return f"no JUnit results ({error}); see the log in the tarball\n"
    cases = list(root.iter("testcase"))
    outcome = collections.Counter()
    failures, skips, times, timeouts = [], collections.Counter(), [], 0
    for case in cases:
        times.append((float(case.get("time", 0)), _nodeid(case)))
        child = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if child is None:
            outcome["passed"] += 1
        elif child.tag == "skipped":
            outcome["skipped"] += 1
            skips[child.get("message", "").strip()[:160]] += 1
        else:
            outcome["failed" if child.tag == "failure" else "errors"] += 1
            message = (child.get("message") or "").strip().splitlines()
            timeouts += bool(TIMEOUT.search(child.get("message") or ""))
            failures.append(f"{_nodeid(case)}: {message[0][:200] if message else child.tag}")
    total_time = sum(t for t, _ in times)
    counts = ", ".join(f"{outcome[k]} {k}" for k in ("passed", "failed", "errors", "skipped"))
    out = [f"{len(cases)} tests run: {counts} ({total_time:.0f} s in tests)"]
    if log:
        try:
            with open(log, errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        stopped = re.findall(r"Interrupted: (.*?) !", text)
        if stopped:
            out.append(f"\n**stopped early**: {stopped[-1]}")
        elif "KeyboardInterrupt" in text:
            out.append("\n**stopped early**: interrupted at the stage's time limit")
    if timeouts:
        out.append(f"\n{timeouts} test(s) hit the per-test timeout")
    if failures:
        out.append("\nFailures:\n")
        out += [f"- `{f}`" for f in failures[:40]]
        if len(failures) > 40:
            out.append(f"- ... and {len(failures) - 40} more (JUnit XML in the tarball)")
    if skips:
        out.append("\nSkipped:\n")
        out += [f"- {n} × {reason}" for reason, n in skips.most_common(10)]
    slow = sorted(times, reverse=True)[:5]
    if slow:
        out.append("\nSlowest: " + "; ".join(f"`{n}` {t:.1f} s" for t, n in slow))
    return "\n".join(out) + "\n"


def sanitizer(path: str) -> str:
    """compute-sanitizer's error summary and its first distinct reports."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as error:
        return f"no sanitizer log ({error})\n"
    summary = [ln.strip("= ") for ln in lines if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
    kinds = collections.Counter()
    first = []
    for i, ln in enumerate(lines):
        m = re.match(r"=+ (Invalid .*|Error: .*|Race reported.*|Barrier error.*|Program hit .*|"
                     r"Uninitialized .*|Misaligned .*)", ln)
        if m:
            kind = re.sub(r"0x[0-9a-f]+|\d+", "N", m.group(1))[:120]
            if kinds[kind] == 0 and len(first) < 5:
                first.append("\n".join(x.strip("= ") for x in lines[i : i + 4]))
            kinds[kind] += 1
    out = [f"summary: {'; '.join(summary) if summary else 'none printed (stopped early?)'}"]
    if kinds:
        out.append("\nReports by kind:\n")
        out += [f"- {n} × {k}" for k, n in kinds.most_common(10)]
        out.append("\nFirst reports:\n")
        out += ["```", *("\n---\n".join(first)).splitlines(), "```"]
    return "\n".join(out) + "\n"


def resources(path: str) -> str:
    """Registers, stack, shared and local (spill) memory per kernel, from
    ``cuobjdump -res-usage``."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as error:
        return f"no resource usage ({error})\n"
    rows, name = [], None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+?):\s*$", line)
        if m:
            name = m.group(1)
        elif name and "REG:" in line:
            field = {k: re.search(rf"\b{k}:(\d+)", line)
                     for k in ("REG", "STACK", "SHARED", "LOCAL")}
            rows.append((name, *(f.group(1) if f else "?" for f in field.values())))
            name = None
    if not rows:
        return "no CUDA kernels in this build\n"
    try:
        names = subprocess.run(["c++filt"], input="\n".join(r[0] for r in rows),
                               capture_output=True, text=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        names = [r[0] for r in rows]
    seen = set()
    out = ["| kernel | regs | stack B | static smem B | local B |", "|---|---:|---:|---:|---:|"]
    by_registers = sorted(zip(names, rows), key=lambda x: -int(x[1][1]))
    for name, (_, reg, stack, shared, local) in by_registers:
        short = re.sub(r"\(.*", "", name)[-90:]
        key = (short, reg, stack, shared, local)
        if key in seen:
            continue
        seen.add(key)
        out.append(f"| `{short}` | {reg} | {stack} | {shared} | {local} |")
    more = "\n| ... (full list in the tarball) | | | | |" if len(out) > 42 else ""
    return "\n".join(out[:42]) + more + "\n"


def ceilings(device: str, out: str | None) -> str:
    """The two ceilings the roofline needs, measured here: device-to-device copy bandwidth
    (bytes read + written) and a dense matrix product's rate."""
    import torch

    cuda = device == "cuda"
    nbytes = 2**31 if cuda else 2**26
    dtype = torch.bfloat16 if cuda else torch.float32
    n = 8192 if cuda else 1024

    def timed(fn, reps):
        fn()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / reps

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), 20 if cuda else 5)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    mm_s = timed(lambda: a @ b, 10 if cuda else 3)
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "copy_GBps": 2 * nbytes / copy_s / 1e9,
        "copy_bytes": nbytes,
        "matmul_TFLOPs": 2 * n**3 / mm_s / 1e12,
        "matmul": f"{n}x{n}x{n} {str(dtype).replace('torch.', '')}, random data",
        "date": time.strftime("%Y-%m-%d"),
    }
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return (
        f"- copy: {result['copy_GBps']:.0f} GB/s (bytes read + written, {nbytes / 2**30:g} GiB "
        f"device-to-device)\n- matmul: {result['matmul_TFLOPs']:.3g} TFLOP/s ({result['matmul']})\n"
    )


# One C++ argument check per device: the op must raise ValueError with its message. Each runs
# in a child process, because the first GPU check (H200, 2026-11-26) saw every C++-raised error
# of the CUDA build end in a segmentation fault inside std::ostream (the message's formatting,
# with libstdc++ code inside _C.so) while the kernels' results were right.
_ERROR_PROBE = """
import sys, torch, specdec_kernels
try:
    torch.ops.specdec.small_batch_linear(torch.randn(2, 3, device=sys.argv[1]),
                                         torch.randn(4, 5, device=sys.argv[1]), None)
except ValueError as e:
    print("ValueError:", str(e)[:120])
    sys.exit(0)
print("no error raised")
sys.exit(1)
"""


def _toolchain() -> str:
    """The compilers the build used and how _C.so links the C++ runtime."""
    import glob
    import os

    lines = [f"- CC={os.environ.get('CC', '(unset)')} CXX={os.environ.get('CXX', '(unset)')}"]
    for compiler in dict.fromkeys([os.environ.get("CXX", "g++"), "/usr/bin/g++"]):
        try:
            version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
            lines.append(f"- `{compiler} --version`: {version.splitlines()[0] if version else '?'}")
        except OSError:
            lines.append(f"- `{compiler}`: not found")
    so = sorted(glob.glob("specdec_kernels/_C*.so"))
    if so:
        ldd = subprocess.run(["ldd", so[0]], capture_output=True, text=True).stdout
        stdcpp = [line.strip() for line in ldd.splitlines() if "stdc++" in line]
        lines.append(f"- `ldd _C.so` libstdc++: {stdcpp[0] if stdcpp else 'none (linked statically?)'}")
        nm = subprocess.run(["nm", "-C", "--defined-only", so[0]], capture_output=True, text=True).stdout
        inside = sum("std::locale::" in line for line in nm.splitlines())
        lines.append(f"- std::locale symbols defined inside _C.so: {inside} (0 when libstdc++ is shared)")
    return "\n".join(lines) + "\n"


def errors(device: str) -> str:
    """Whether a C++ argument check raises ValueError on DEVICE (and on the CPU) or crashes."""
    lines = []
    for dev in dict.fromkeys(["cpu", device]):
        run = subprocess.run([sys.executable, "-c", _ERROR_PROBE, dev], capture_output=True, text=True,
                             timeout=120)
        said = (run.stdout.strip() or run.stderr.strip()).splitlines()[-1:] or ["(nothing)"]
        verdict = "raises" if run.returncode == 0 else f"**exit status {run.returncode}**"
        lines.append(f"- C++ argument check on {dev}: {verdict} ({said[0][:160]})")
    return "\n".join(lines) + "\n" + _toolchain()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env")
    p = sub.add_parser("junit")
    p.add_argument("xml")
    p.add_argument("log", nargs="?")
    sub.add_parser("sanitizer").add_argument("log")
    sub.add_parser("resources").add_argument("dump")
    p = sub.add_parser("ceilings")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out")
    sub.add_parser("errors").add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.cmd == "env":
        text = env()
    elif args.cmd == "junit":
        text = junit(args.xml, args.log)
    elif args.cmd == "sanitizer":
        text = sanitizer(args.log)
    elif args.cmd == "resources":
        text = resources(args.dump)
    elif args.cmd == "errors":
        text = errors(args.device)
    else:
        text = ceilings(args.device, args.out)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
