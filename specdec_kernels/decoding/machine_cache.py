"""What was measured on the machine the package runs on, kept per machine.

Which kernels are fastest, and how a step's cost grows with its width, are properties of the
machine: the CPU, the instruction set the package's kernels use on it (which
``SPECDEC_CPU_ISA`` / :func:`specdec_kernels.ops.cpu_isa` may cap), the thread count and the
torch build, and of the package's own code: its compiled kernels and the Python forward that
calls them (:func:`code_revision`; a measurement of older kernels says nothing about newer
ones). :func:`fingerprint` names them; :func:`measured` keeps a measurement per
fingerprint (and whatever else it depends on, e.g. a model's weight shapes) in one small JSON
file, so it runs once per machine, not once per process.

The file is ``$SPECDEC_CACHE_DIR/machine.json`` (default ``$XDG_CACHE_HOME/specdec_kernels``,
else ``~/.cache/specdec_kernels``). Delete it, or call :func:`forget`, to measure again. A
cache that cannot be written (read-only home) only costs the measurement in every process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

__all__ = ["cache_file", "code_revision", "cpu_model", "fingerprint", "forget", "lookup",
           "measured", "measuring", "measuring_seconds", "store"]


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=1)
def code_revision() -> str:
    """A digest of the package code a step's cost depends on: the compiled extension and the
    direct forward (``models/direct_forward.py``). A rebuild with other kernels, or another
    forward, gets measurements of its own (the 2026-11-26 decoder-layer ops made a step a
    third cheaper, and trees sized on the older curve were too large)."""
    from specdec_kernels import _C
    from specdec_kernels.models import direct_forward

    digest = hashlib.sha1()
    for path in (_C.__file__, direct_forward.__file__):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def fingerprint() -> dict:
    """What a measurement on this machine depends on: CPU model, the instruction set the
    package's CPU kernels use now (after any cap), torch's thread count and torch version, and
    the package's own code (:func:`code_revision`)."""
    from specdec_kernels import ops

    return {
        "cpu": cpu_model(),
        "isa": ops.cpu_isa(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "code": code_revision(),
    }


def cache_file() -> Path:
    """The JSON file that holds the measurements."""
    root = os.environ.get("SPECDEC_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "specdec_kernels")
    return Path(root) / "machine.json"


def _entry_key(kind: str, key: dict) -> str:
    return json.dumps({"kind": kind, **fingerprint(), **key}, sort_keys=True)


def _load() -> dict:
    try:
        with open(cache_file()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def lookup(kind: str, key: dict | None = None) -> dict | None:
    """The stored measurement of ``kind`` for this machine and ``key``, or None."""
    return _load().get(_entry_key(kind, key or {}))


def store(kind: str, key: dict | None, value: dict) -> None:
    """Keep ``value`` (JSON-ready) as the measurement of ``kind`` for this machine and ``key``.
    The file is replaced atomically; a cache that cannot be written is skipped."""
    path = cache_file()
    data = _load()
    data[_entry_key(kind, key or {})] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except OSError:
        pass


def forget(kind: str | None = None, where: dict | None = None) -> None:
    """Drop the stored measurements of ``kind`` (every kind when None) whose key holds every
    item of ``where`` (on every machine when None; ``{**fingerprint(), ...}`` for this one)."""

    def dropped(entry: str) -> bool:
        key = json.loads(entry)
        return (kind is None or key.get("kind") == kind) and all(
            key.get(name) == value for name, value in (where or {}).items())

    data = _load()
    kept = {k: v for k, v in data.items() if not dropped(k)}
    if kept == data:
        return
    try:
        with open(cache_file(), "w") as f:
            json.dump(kept, f, indent=1, sort_keys=True)
    except OSError:
        pass


_measuring_total = 0.0  # seconds this process has spent measuring the machine


@contextlib.contextmanager
def measuring():
    """Counts the time of its block as time spent measuring the machine
    (:func:`measuring_seconds`)."""
    global _measuring_total
    start = time.perf_counter()
    try:
        yield
    finally:
        _measuring_total += time.perf_counter() - start


def measuring_seconds() -> float:
    """Seconds this process has spent measuring the machine so far (:func:`measured`'s
    measurements and the step and draft costs of
    :mod:`~specdec_kernels.decoding.calibration`, each once per machine and model, inside the
    first run that needs it): the engine leaves them out of a run's timings."""
    return _measuring_total


def measured(kind: str, key: dict | None, measure: Callable[[], dict]) -> dict:
    """The stored measurement of ``kind`` for this machine and ``key``; ``measure()`` (then
    stored) when there is none."""
    found = lookup(kind, key)
    if found is None:
        with measuring():
            found = measure()
        store(kind, key, found)
    return found
