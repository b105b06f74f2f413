"""``scripts/install.sh`` says what it does and shows the extension build's progress, with a
stand-in Python whose pip "builds" quickly (the real build is what CI runs)."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for python3: every pip install succeeds at once except the editable build,
# which prints ninja-like steps (as torch's build does under pip -v) a few seconds apart.
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
  *" -e ."*)
    echo "running build_ext"
    sleep 1
    echo "  [1/2] c++ -MMD -MF /tmp/b/csrc/a.o.d -I$PWD/csrc -c $PWD/csrc/a.cpp -o /tmp/b/a.o -O3"
    sleep 3
    echo "  [2/2] c++ -MMD -MF /tmp/b/csrc/b.o.d -I$PWD/csrc -c $PWD/csrc/b.cpp -o /tmp/b/b.o -O3"
    sleep 3
    echo "csrc/b.cpp:1: error: something" >&2
    exit $FAKE_BUILD_STATUS;;
esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    (tmp_path / "csrc" / "cuda").mkdir(parents=True)
    for name in ("a.cpp", "b.cpp", "cuda/c.cu"):
        (tmp_path / "csrc" / name).write_text("")
    python = tmp_path / "fake-python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def _install(checkout, status):
    env = dict(os.environ, PYTHON=str(checkout / "fake-python"), FAKE_BUILD_STATUS=str(status))
    return subprocess.run(["bash", "scripts/install.sh"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=120)


def test_install_announces_each_step_and_the_build_progress(checkout):
    done = _install(checkout, 0)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "==> Installing torch 2.13.0 (CPU build; a large download the first time)"
    assert any("CPU kernels (2 C++ files, about 2 minutes" in line for line in lines)
    assert any("CUDA kernels (1 .cu files" in line for line in lines)
    assert "    full compiler output: build/install-build.log" in lines
    progress = [line.split("  (")[0].strip() for line in lines if "compiled" in line]
    assert progress == ["[1/2] compiled csrc/a.cpp", "[2/2] compiled csrc/b.cpp"]
    assert lines[-1].startswith("==> Built and installed in ")
    assert "[2/2] c++ -MMD" in (checkout / "build" / "install-build.log").read_text()


def test_a_failed_build_shows_the_end_of_its_log(checkout):
    done = _install(checkout, 1)
    assert done.returncode == 1
    assert "The build failed; the end of build/install-build.log:" in done.stderr
    assert "csrc/b.cpp:1: error: something" in done.stderr
    assert "Built and installed" not in done.stdout


def test_readme_shows_the_two_commands_unchanged():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/install.sh && python3 -m specdec_kernels.bench" in readme
    assert "bash scripts/install.sh && python3 -m pytest -q -n 2" in readme


def test_install_script_and_pyproject_declare_one_range():
    """The transformers and torch ranges: pyproject.toml declares them, install.sh installs
    the same, the README's table says them, and the floor check reads pyproject.toml."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    install = (ROOT / "scripts" / "install.sh").read_text()
    readme = (ROOT / "README.md").read_text()
    (declared,) = re.findall(r'"(transformers>=[0-9.]+,<[0-9.]+)"', pyproject)
    assert f'TRANSFORMERS_RANGE="{declared}"' in install
    floor, cap = re.match(r"transformers>=([0-9.]+),<([0-9.]+)", declared).groups()
    assert f"| transformers | >= {floor}, < {cap} |" in readme
    torch_floor = re.search(r'"torch>=([0-9.]+)"', pyproject).group(1)
    assert f'"torch=={torch_floor}.0"' in install  # install.sh pins the tested torch
    assert f"| torch | >= {torch_floor} |" in readme
    check = subprocess.run(["bash", "scripts/check_transformers.sh", "nonsense"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and "usage" in check.stderr


def test_setup_refuses_a_compiler_without_a_shared_libstdcxx(tmp_path):
    """A compiler that finds only libstdc++.a (the GPU machines' /opt/gcc) would put a second
    C++ runtime inside _C.so, and every error raised from C++ crashed the process: the build
    stops first and names the fix."""
    fake = tmp_path / "g++"
    fake.write_text("#!/bin/sh\necho libstdc++.so\n")  # what -print-file-name says when missing
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    run = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT,
                         env={**os.environ, "CXX": str(fake)}, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert f"CXX={fake} finds no shared libstdc++" in run.stderr
    assert "CXX=/usr/bin/g++" in run.stderr
