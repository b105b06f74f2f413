"""What a benchmark figure was measured on: CPU model, the instruction set the package's CPU
kernels run (``ops.cpu_isa()``) and torch's own, threads, library versions. Every report
(``results.json``, ``results.md``, the plots) names them: the same method is ~2x faster or
slower on another CPU (AVX-512 against AVX2), so a figure without its machine misleads."""

from __future__ import annotations

import os
import platform
import sys

from specdec_kernels.decoding.machine_cache import cpu_model

__all__ = ["ISA_CHOICES", "TORCH_ISA_ENV", "cap_isa", "cpu_model", "machine_info", "machine_line"]

#: What torch's own libraries read at start-up to stay at or below an instruction set (ATen's
#: kernels, oneDNN, MKL): with them an AVX-512 machine runs torch as an AVX2 machine would.
TORCH_ISA_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "portable": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}

#: The ``--isa`` choices of the benchmark commands (see :func:`cap_isa`).
ISA_CHOICES = ["avx2", "avx512", "avx512_bf16", "portable"]


def machine_info(device: str = "cpu") -> dict:
    """The machine fields of a benchmark's ``config``."""
    import torch
    import transformers

    from specdec_kernels import ops

    info = {
        "cpu": cpu_model(),
        "cpu_isa": ops.cpu_isa(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def machine_line(config: dict) -> str:
    """One line naming the machine of a report (fields of :func:`machine_info`; older
    reports without them say so)."""
    if "cpu" not in config:
        return "Machine: not recorded"
    parts = [f"CPU {config['cpu']}", f"package kernels: {config.get('cpu_isa')}",
             f"torch kernels: {config.get('torch_cpu_capability')}",
             f"{config.get('threads')} threads"]
    if config.get("gpu"):
        parts.insert(0, f"GPU {config['gpu']}")
    parts.append(f"torch {config.get('torch')}, transformers {config.get('transformers')}")
    return "Machine: " + "; ".join(parts)


def cap_isa(isa: str | None) -> str:
    """Run this process as a CPU with instruction set ``isa`` would (``"avx2"``,
    ``"portable"``; ``"avx512"`` / ``"avx512_bf16"`` cap only the package's kernels): the
    package's kernels through :func:`specdec_kernels.ops.cpu_isa`, torch's through
    :data:`TORCH_ISA_ENV`, which torch reads at start-up, so the process restarts itself (same
    command line) once with them set. Call it first thing in a command-line tool.

    Returns
    -------
    str
        The instruction set the package's kernels now use.
    """
    from specdec_kernels import ops

    if isa is None:
        return ops.cpu_isa()
    wanted = TORCH_ISA_ENV.get(isa, {})
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        os.environ.update(wanted)
        os.environ["SPECDEC_CPU_ISA"] = isa
        os.execv(sys.executable, sys.orig_argv)
    return ops.cpu_isa(isa)
