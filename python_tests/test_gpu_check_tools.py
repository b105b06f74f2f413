"""The pieces of scripts/gpu_check.sh that can be checked without a GPU: the time limits of
python_tests/pytest_deadline.py (a session under a hard limit still ends with its summary; a
test that hangs fails alone, with or without pytest-timeout), the report's parsers of JUnit
XML, compute-sanitizer logs and cuobjdump's resource usage, and the script's own handling of
its arguments, of a missing or stale build and of the files it leaves under $OUT."""

import importlib.util
import os
import re
import shutil
import subprocess
import tarfile
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    path = ROOT / "scripts" / "gpu_check_report.py"
    spec = importlib.util.spec_from_file_location("gpu_check_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_pytest(tmp_path, *args, sleep=4, pythonpath=()):
    (tmp_path / "test_three.py").write_text(textwrap.dedent(f"""
        import time
        def test_a(): pass
        def test_b(): time.sleep({sleep})
        def test_c(): pass
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *pythonpath])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
         "-p", "python_tests.pytest_deadline", f"--junitxml={tmp_path / 'out.xml'}",
         "test_three.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


def test_stop_after_ends_the_session_with_its_summary(tmp_path, report):
    done = run_pytest(tmp_path, "--stop-after", "2")
    assert done.returncode == 2, done.stdout  # interrupted
    assert "--stop-after 2 s spent; not run from test_three.py::test_c" in done.stdout
    assert "2 passed" in done.stdout
    summary = report.junit(str(tmp_path / "out.xml"), None)
    assert summary.startswith("2 tests run: 2 passed, 0 failed")


def test_without_options_every_test_runs(tmp_path):
    done = run_pytest(tmp_path, sleep=0.5)
    assert done.returncode == 0 and "3 passed" in done.stdout
    assert "per-test timeout" not in done.stdout


def test_per_test_timeout_without_pytest_timeout_fails_the_test_alone(tmp_path, report):
    # -p no:timeout: the SIGALRM fallback, also where pytest-timeout is installed.
    done = run_pytest(tmp_path, "-p", "no:timeout", "--per-test-timeout", "1", sleep=60)
    assert done.returncode == 1, done.stdout
    assert "per-test timeout: 1 s (SIGALRM fallback)" in done.stdout
    failed = "FAILED test_three.py::test_b - Failed: Timeout (>1s) from pytest_deadline."
    assert failed in done.stdout
    assert "1 failed, 2 passed" in done.stdout
    summary = report.junit(str(tmp_path / "out.xml"), None)
    assert summary.startswith("3 tests run: 2 passed, 1 failed")
    assert "1 test(s) hit the per-test timeout" in summary
    # The timer was cancelled with the test: the slow test took about its limit, no more.
    xml = (tmp_path / "out.xml").read_text()
    assert float(re.search(r'name="test_b" time="([0-9.]+)"', xml)[1]) < 10


def test_per_test_timeout_goes_through_pytest_timeout_where_installed(tmp_path, report):
    spec = importlib.util.find_spec("pytest_timeout")
    if spec is None:
        pytest.skip("pytest-timeout is not installed here (the GPU machine has it)")
    done = run_pytest(tmp_path, "--per-test-timeout", "1", sleep=60,
                      pythonpath=[str(Path(spec.origin).parent)])
    assert done.returncode == 1, done.stdout
    assert "per-test timeout: 1 s (pytest-timeout, signal method)" in done.stdout
    assert "Timeout (>1.0s) from pytest-timeout" in done.stdout
    assert "1 failed, 2 passed" in done.stdout
    assert "1 test(s) hit the per-test timeout" in report.junit(str(tmp_path / "out.xml"), None)


def test_junit_summary_lists_failures_and_skip_reasons(tmp_path, report):
    xml = tmp_path / "r.xml"
    xml.write_text("""<testsuites><testsuite>
      <testcase classname="python_tests.test_x" name="test_ok[cuda]" time="0.5"/>
      <testcase classname="python_tests.test_x" name="test_bad[cuda]" time="2.0">
        <failure message="AssertionError: 3 != 4&#10;more">trace</failure></testcase>
      <testcase classname="python_tests.test_y" name="test_model" time="0">
        <skipped message="needs the bundled default model: not found"/></testcase>
      <testcase classname="python_tests.test_y" name="test_hangs" time="150.0">
        <failure message="Failed: Timeout (&gt;150.0s) from pytest-timeout.">trace</failure>
      </testcase>
    </testsuite></testsuites>""")
    log = tmp_path / "r.log"
    log.write_text("! Interrupted: --stop-after 300 s spent; not run from x !\n")
    text = report.junit(str(xml), str(log))
    assert text.startswith("4 tests run: 1 passed, 2 failed, 0 errors, 1 skipped")
    assert "`python_tests/test_x.py::test_bad[cuda]: AssertionError: 3 != 4`" in text
    assert "1 × needs the bundled default model: not found" in text
    assert "**stopped early**: --stop-after 300 s spent" in text
    assert "1 test(s) hit the per-test timeout" in text
    assert "Slowest: `python_tests/test_y.py::test_hangs` 150.0 s" in text
    assert "no JUnit results" in report.junit(str(tmp_path / "missing.xml"))


def test_sanitizer_summary_counts_reports_by_kind(tmp_path, report):
    log = tmp_path / "memcheck.log"
    log.write_text(textwrap.dedent("""\
        ========= COMPUTE-SANITIZER
        ========= Invalid __global__ write of size 4 bytes
        =========     at void specdec::compact_kv_rows_kernel<float>(...)+0x1f0
        =========     by thread (3,0,0) in block (0,0,0)
        ========= Invalid __global__ write of size 4 bytes
        =========     at void specdec::compact_kv_rows_kernel<float>(...)+0x1f0
        ========= ERROR SUMMARY: 2 errors
    """))
    text = report.sanitizer(str(log))
    assert "summary: ERROR SUMMARY: 2 errors" in text
    assert "- 2 × Invalid __global__ write of size N bytes" in text
    assert "compact_kv_rows_kernel" in text
    clean = tmp_path / "clean.log"
    clean.write_text("========= ERROR SUMMARY: 0 errors\n")
    assert "Reports by kind" not in report.sanitizer(str(clean))


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt (binutils) to demangle")
def test_resource_usage_table_sorted_by_registers(tmp_path, report):
    dump = tmp_path / "res.txt"
    dump.write_text(textwrap.dedent("""\
        Resource usage:
         Common:
          GLOBAL:0
         Function _Z4axpyIfEvPT_S0_i:
          REG:8 STACK:0 SHARED:256 LOCAL:8 CONSTANT[0]:368 TEXTURE:0 SURFACE:0 SAMPLER:0
         Function _Z4axpyIdEvPT_S0_i:
          REG:40 STACK:16 SHARED:512 LOCAL:0 CONSTANT[0]:372 TEXTURE:0 SURFACE:0 SAMPLER:0
    """))
    rows = [ln for ln in report.resources(str(dump)).splitlines() if "axpy" in ln]
    assert rows == [
        "| `void axpy<double>` | 40 | 16 | 512 | 0 |",
        "| `void axpy<float>` | 8 | 0 | 256 | 8 |",
    ]
    empty = tmp_path / "none.txt"
    empty.write_text("")
    assert report.resources(str(empty)) == "no CUDA kernels in this build\n"


def gpu_check(tmp_path, *args, **env):
    """Run scripts/gpu_check.sh with its state and $OUT in tmp_path (never the real ones)."""
    env = {**os.environ, "GPU_CHECK_STATE": str(tmp_path / "state"), "OUT": str(tmp_path / "out"),
           "GPU_CHECK_DRY": "1", **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_script_usage_and_fingerprint(tmp_path):
    done = gpu_check(tmp_path)
    assert done.returncode == 2 and "usage:" in done.stdout
    done = gpu_check(tmp_path, "kernels", "tests")
    assert done.returncode == 2 and "unknown stage: tests" in done.stdout
    done = gpu_check(tmp_path, "fingerprint")
    assert done.returncode == 0 and re.fullmatch(r"[0-9a-f]{12}\n", done.stdout)
    assert not (tmp_path / "out").exists()


def test_script_refuses_to_run_a_stage_without_a_build(tmp_path):
    # A fresh machine: no build marker. The stage runs nothing, says why, and still returns
    # the report and the tarball, nothing else; a log too large for the device goes in cut.
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "huge.log").write_text("line\n" * 1_100_000)
    done = gpu_check(tmp_path, "kernels", "sanitize")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "NO BUILD ON THIS MACHINE" in done.stderr
    report = (tmp_path / "out" / "gpu_check.md").read_text()
    assert report.startswith("## GPU check") and "**Dry run on CPU**" in report
    assert report.count("NO BUILD ON THIS MACHINE") == 2  # one per stage
    assert "bash scripts/gpu_check.sh build" in report
    assert "### kernels" in done.stdout and "(2 files under $OUT; status 4)" in done.stdout
    returned = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert returned == ["gpu_check.md", "gpu_check_logs.tar.gz"]
    with tarfile.open(tmp_path / "out" / "gpu_check_logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"gpu_check.md", "huge.log.cut"} <= names and "huge.log" not in names
    assert (tmp_path / "out" / "gpu_check_logs.tar.gz").stat().st_size < 1_000_000


def test_script_refuses_a_stale_build(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state.built").write_text("sources 000000000000, cuda 0, python 0, torch 0\n")
    done = gpu_check(tmp_path, "e2e")
    assert done.returncode == 4
    report = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "BUILD IS STALE: built from sources 000000000000" in report


def test_script_reset_starts_a_new_report_and_keeps_the_build_marker(tmp_path):
    gpu_check(tmp_path, "bench")
    (tmp_path / "state.built").write_text("stale\n")
    done = gpu_check(tmp_path, "reset", "bench")
    assert done.returncode == 4
    report = (tmp_path / "out" / "gpu_check.md").read_text()
    assert report.count("### bench") == 1 and "BUILD IS STALE: built from stale" in report
    assert (tmp_path / "state.built").is_file()
