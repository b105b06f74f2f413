"""The step-cost curve of the machine the package runs on.

Drafts and trees are sized from ``c(T)``, the cost of one target forward over ``T`` tokens
(:class:`~specdec_kernels.decoding.cost.StepCost`). That is a property of the machine, the
model's shape and the kernels in use, so it is measured where the package runs: the first time
a drafter asks (:meth:`ModelRunner.step_cost
<specdec_kernels.decoding.runner.ModelRunner.step_cost>`), a few seconds of forwards of the
user's own model after a cached prefix, kept per machine and model
(:mod:`~specdec_kernels.decoding.machine_cache`), so later runs read it. ``specdec calibrate``
measures again (:func:`calibrate`).

``SPECDEC_STEP_COST=shipped`` uses the curve the package ships (measured on its development
CPU for the default model's shape) instead, as the tests do (their tree sizes must not depend on
the machine's timing).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from specdec_kernels.decoding import machine_cache
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.models.quantized_weight import QuantizedWeight

__all__ = [
    "PREFIX",
    "WIDTHS",
    "calibrate",
    "machine_step_cost",
    "measure_step_cost",
    "step_cost_key",
]

#: Tokens per request verified in one forward, at which ``c(T)`` is measured (the shipped
#: curve's range; the budget interpolates between them).
WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Cached tokens before the measured block (a short conversation's worth).
PREFIX = 256
_KIND = "step_cost"
_ENV = "SPECDEC_STEP_COST"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def measure_step_cost(runner, *, widths=WIDTHS, prefix: int = PREFIX, rounds: int = 5) -> dict:
    """``{T: ms}``: the median over ``rounds`` of one forward of ``runner``'s model over ``T``
    tokens of one request after ``prefix`` cached tokens (the rows past the prefix are
    rewritten by every forward and never committed). Widths are interleaved round by round,
    so a drift of the machine's speed spreads over all of them, and the curve is made
    non-decreasing (a wider block never costs less; a lower reading is noise).

    Parameters
    ----------
    runner : ModelRunner
        Its model, device and kernels are what is measured.
    widths : sequence of int
    prefix : int
    rounds : int

    Returns
    -------
    dict
        ``{T: milliseconds}``.
    """
    widths = sorted(int(t) for t in widths)
    gen = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    cache = runner.new_cache(1, prefix + widths[-1])
    runner.append(cache, [torch.randint(vocab, (prefix,), generator=gen).tolist()])
    blocks = {t: torch.randint(vocab, (1, t), generator=gen).to(runner.device) for t in widths}
    samples: dict = {t: [] for t in widths}
    # Two rounds warm up: in a process that has just loaded the model, the first forwards of
    # each width run up to 1.5x slow (seen in the bench's first calibration, 2026-11-26).
    for round_ in range(rounds + 2):
        for t in widths:
            _synchronize(runner.device)
            start = time.perf_counter()
            runner.forward(cache, blocks[t], cache.host_lens)
            _synchronize(runner.device)
            if round_ >= 2:
                samples[t].append((time.perf_counter() - start) * 1e3)
    curve, floor = {}, 0.0
    for t in widths:
        floor = max(floor, statistics.median(samples[t]))
        curve[t] = round(floor, 4)
    return curve


def weight_formats(model) -> list:
    """The model's linear layers by class and weight format (a quantized one by its kind, e.g.
    ``int4/g32``: a file-precision model's step costs what its kernel costs, not a float one's)."""
    formats = set()
    for module in model.modules():
        name = type(module).__name__
        if "Linear" not in name:
            continue
        weight = getattr(module, "weight", None)
        if isinstance(weight, QuantizedWeight):
            name += f"[{weight.kind or f'{weight.qweight.dtype} g{weight.group}'}]"
        formats.add(name)
    return sorted(formats)


def step_cost_key(runner) -> dict:
    """What a step's cost depends on besides the machine (:func:`machine_cache.fingerprint`):
    the model's shape, its weights' dtype, the device, the kernels in use and whether the
    forwards call the model or run its direct forward."""
    c = runner.config
    shape = {name: getattr(c, name, None) for name in (
        "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
        "num_attention_heads", "num_key_value_heads", "vocab_size")}
    return {
        "model": shape,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "weights": weight_formats(runner.model),
        "device": str(runner.device),
        "kernels": runner.kernels.path,
        "forward": runner.forward_path,
        "widths": list(WIDTHS),
        "prefix": PREFIX,
    }


def calibrate(runner) -> StepCost:
    """Measure ``c(T)`` of ``runner``'s model on this machine now (:func:`measure_step_cost`)
    and keep it in the machine cache for later runs (``specdec calibrate``)."""
    measured = {"latency_ms": measure_step_cost(runner)}
    machine_cache.store(_KIND, step_cost_key(runner), measured)
    return StepCost(measured["latency_ms"], source=f"measured here ({machine_cache.cache_file()})")


def machine_step_cost(runner) -> StepCost:
    """``c(T)`` of ``runner``'s model on this machine: read from the machine cache, or
    measured once (:func:`calibrate`, with a note on stderr while it runs); the shipped curve
    under ``SPECDEC_STEP_COST=shipped``.

    Raises
    ------
    ValueError
        ``SPECDEC_STEP_COST`` set to something other than ``machine`` or ``shipped``.
    """
    setting = os.environ.get(_ENV, "machine").strip().lower() or "machine"
    if setting not in ("machine", "shipped"):
        raise ValueError(f"{_ENV} must be 'machine' or 'shipped', got {setting!r}")
    if setting == "shipped":
        return StepCost.load(None)
    found = machine_cache.lookup(_KIND, step_cost_key(runner))
    if found is not None:
        return StepCost(found["latency_ms"], source=f"measured here ({machine_cache.cache_file()})")
    print(f"specdec: measuring this machine's step cost for the model (once; kept in "
          f"{machine_cache.cache_file()})", file=sys.stderr)
    return calibrate(runner)
