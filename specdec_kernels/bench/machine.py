"""What a benchmark figure was measured on: CPU model, the instruction set the package's CPU
kernels run (``ops.cpu_isa()``) and torch's own, threads, library versions. Every report
(``results.json``, ``results.md``, the plots) names them: the same method is ~2x faster or
slower on another CPU (AVX-512 against AVX2), so a figure without its machine misleads."""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_model", "machine_info", "machine_line"]


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
