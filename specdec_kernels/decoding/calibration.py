"""The step-cost curve of the machine the package runs on.

Drafts and trees are sized from ``c(T)``, the cost of one target forward over ``T`` tokens
(:class:`~specdec_kernels.decoding.cost.StepCost`). That is a property of the machine, the
model's shape, the kernels in use and the context the step's attention reads (measured after a
short and a long cached prefix, :data:`PREFIXES`; the drafters ask for the cost at each step's
context), so it is measured where the package runs: the first time
a drafter asks (:meth:`ModelRunner.step_cost
<specdec_kernels.decoding.runner.ModelRunner.step_cost>`), a few seconds of forwards of the
user's own model after each of two cached prefixes, kept per machine and model
(:mod:`~specdec_kernels.decoding.machine_cache`), so later runs read it. ``specdec calibrate``
measures again (:func:`calibrate`).

A chain drafter also needs what one of its draft forwards costs: that is measured as a ratio to
a target token after the same prefixes, interleaved with the target's forwards
(:func:`measure_draft_cost`), and cached the same way (a draft reads as many keys as the
target: the int4 copy of the default model pays the same attention as its float32 target).

``SPECDEC_STEP_COST=shipped`` uses the curve the package ships (measured on its development
CPU for the default model's shape) instead, as the tests do (their tree sizes must not depend on
the machine's timing).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import torch

from specdec_kernels.decoding import machine_cache
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.models.quantized_weight import QuantizedWeight

__all__ = [
    "DRAFT_WIDTHS",
    "PREFIXES",
    "WIDTHS",
    "calibrate",
    "machine_draft_cost",
    "machine_step_cost",
    "measure_draft_cost",
    "measure_step_cost",
    "measured_prefixes",
    "step_cost_key",
    "uses_shipped_curve",
]

#: Tokens per request verified in one forward, at which ``c(T)`` is measured (the shipped
#: curve's range; the budget interpolates between them). 6 and 12: the AVX-512 float kernel
#: takes rows 6 at a time, so c(5), c(6) are about c(4) there, not halfway to c(8).
WIDTHS = (1, 2, 4, 6, 8, 12, 16, 32, 64, 128)
#: Rows of a draft forward at which its cost is measured (a batch of requests, one token
#: each, measured as one request's block of that width, as the target's curve is).
DRAFT_WIDTHS = (1, 2, 4, 8, 16, 32)
#: Cached tokens before the measured block: a short conversation's worth, and a long
#: prompt's (summaries and retrieval-augmented prompts run 1-3k tokens). The float32 default
#: model's c(16) is 28.5 ms after 256 and 48.2 ms after 2048 on the development Zen 4
#: (2026-12-04); between and past them the cost is taken linear in the context
#: (:class:`StepCost`).
PREFIXES = (256, 2048)
_KIND = "step_cost"
_DRAFT_KIND = "draft_cost"
_ENV = "SPECDEC_STEP_COST"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward_block(runner, widths, prefix: int, gen, exit_layer=None) -> dict:
    """``{T: call}``: one forward of ``runner`` over ``T`` random tokens after ``prefix`` cached
    random tokens (the rows past the prefix are rewritten by every call, never committed)."""
    vocab = runner.vocab_size
    cache = runner.new_cache(1, prefix + max(widths))
    runner.append(cache, [torch.randint(vocab, (prefix,), generator=gen).tolist()])
    calls = {}
    for t in widths:
        block = torch.randint(vocab, (1, t), generator=gen).to(runner.device)
        calls[t] = functools.partial(runner.forward, cache, block, cache.host_lens,
                                     exit_layer=exit_layer)
    return calls


def _median_ms(calls: dict, device: torch.device, rounds: int) -> dict:
    """``{name: ms}``: the median time of each call over ``rounds``, the calls interleaved round
    by round (a drift of the machine's speed spreads over all of them)."""
    samples: dict = {name: [] for name in calls}
    # Two rounds warm up: in a process that has just loaded the model, the first forwards of
    # each width run up to 1.5x slow (seen in the bench's first calibration, 2026-11-26).
    for round_ in range(rounds + 2):
        for name, call in calls.items():
            _synchronize(device)
            start = time.perf_counter()
            call()
            _synchronize(device)
            if round_ >= 2:
                samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(times) for name, times in samples.items()}


def _non_decreasing(curve: dict) -> dict:
    """A wider block never costs less: a lower reading is noise."""
    out, floor = {}, 0.0
    for t in sorted(curve):
        floor = max(floor, curve[t])
        out[t] = round(floor, 4)
    return out


def measured_prefixes(runners, prefixes=PREFIXES, widths=WIDTHS) -> list:
    """The prefixes that fit the positions of ``runners`` (one runner or several) with the
    widest block after them (a longer one is cut to what fits), without repeats."""
    runners = runners if isinstance(runners, (list, tuple)) else [runners]
    limits = [getattr(r.config, "max_position_embeddings", None) for r in runners]
    limits = [int(limit) for limit in limits if limit is not None]
    if not limits:
        return sorted(set(prefixes))
    room = max(min(limits) - max(widths), 1)
    return sorted({min(int(p), room) for p in prefixes})


@torch.inference_mode()
def measure_step_cost(runner, *, widths=WIDTHS, prefixes=PREFIXES, rounds: int = 5) -> dict:
    """``{prefix: {T: ms}}``: the median over ``rounds`` of one forward of ``runner``'s model
    over ``T`` tokens of one request after ``prefix`` cached tokens, every (prefix, width)
    interleaved round by round, each curve made non-decreasing.

    Parameters
    ----------
    runner : ModelRunner
        Its model, device and kernels are what is measured.
    widths : sequence of int
    prefixes : sequence of int
        Cut to the model's positions (:func:`measured_prefixes`).
    rounds : int

    Returns
    -------
    dict
        ``{prefix: {T: milliseconds}}``.
    """
    widths = sorted(int(t) for t in widths)
    gen = torch.Generator().manual_seed(0)
    calls = {(prefix, t): call for prefix in measured_prefixes(runner, prefixes, widths)
             for t, call in _forward_block(runner, widths, prefix, gen).items()}
    times = _median_ms(calls, runner.device, rounds)
    curves: dict = {}
    for (prefix, t), ms in times.items():
        curves.setdefault(prefix, {})[t] = ms
    return {prefix: _non_decreasing(curve) for prefix, curve in curves.items()}


@torch.inference_mode()
def measure_draft_cost(target, draft, *, exit_layer: int | None = None, widths=DRAFT_WIDTHS,
                       prefixes=PREFIXES, rounds: int = 5) -> dict:
    """``{prefix: {T: r}}``: one forward of the draft over ``T`` tokens, in units of one
    forward of the target over one token, both after ``prefix`` cached tokens, everything
    interleaved round by round.

    A ratio taken within one run: the draft's and the target's costs measured minutes apart
    on a shared host can differ by half from its drift alone (seen on the development CPU,
    2026-11-27), and a chain's length is decided by their ratio.

    Parameters
    ----------
    target : ModelRunner
    draft : ModelRunner
        The draft's runner (the target's own, with ``exit_layer``, for a layer-skip draft).
    exit_layer : int, optional
        The draft's forward leaves after this many decoder layers.
    widths, prefixes, rounds
        As in :func:`measure_step_cost` (the prefixes cut to both models' positions).

    Returns
    -------
    dict
        ``{prefix: {T: draft ms / target ms at T = 1}}``, each non-decreasing.
    """
    widths = sorted(int(t) for t in widths)
    gen = torch.Generator().manual_seed(0)
    calls = {}
    for prefix in measured_prefixes([target, draft], prefixes, widths):
        for t, call in _forward_block(draft, widths, prefix, gen, exit_layer).items():
            calls[("draft", prefix, t)] = call
        calls[("target", prefix, 1)] = _forward_block(target, (1,), prefix, gen)[1]
    times = _median_ms(calls, target.device, rounds)
    ratios: dict = {}
    for (who, prefix, t), ms in times.items():
        if who == "draft":
            ratios.setdefault(prefix, {})[t] = ms / times[("target", prefix, 1)]
    return {prefix: _non_decreasing(curve) for prefix, curve in ratios.items()}


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


def step_cost_key(runner, exit_layer: int | None = None) -> dict:
    """What a step's cost depends on besides the machine (:func:`machine_cache.fingerprint`):
    the model's shape, its weights' dtype, the device, the kernels in use, whether the
    forwards call the model or run its direct forward, and the layer a forward that leaves
    early leaves after."""
    c = runner.config
    shape = {name: getattr(c, name, None) for name in (
        "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
        "num_attention_heads", "num_key_value_heads", "vocab_size")}
    key = {
        "model": shape,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "weights": weight_formats(runner.model),
        "device": str(runner.device),
        "kernels": runner.kernels.path,
        "forward": runner.forward_path,
        "widths": list(WIDTHS),
        "prefixes": list(PREFIXES),
    }
    if exit_layer is not None:
        key["exit_layer"] = exit_layer
    if runner.vocab_size != shape["vocab_size"]:  # a head over some tokens (draft_vocab)
        key["head_rows"] = runner.vocab_size
    return key


def calibrate(runner) -> StepCost:
    """Measure ``c(T)`` of ``runner``'s model on this machine now, after each of
    :data:`PREFIXES` (:func:`measure_step_cost`), and keep it in the machine cache for later
    runs (``specdec calibrate``); its drafts' costs (:func:`machine_draft_cost`) are measured
    again at their next use."""
    curves = measure_step_cost(runner)
    measured = {"latency_ms_by_prefix": {str(p): {str(t): ms for t, ms in c.items()}
                                         for p, c in curves.items()}}
    machine_cache.store(_KIND, step_cost_key(runner), measured)
    # Its drafts' costs were ratios to the old measurement: measured again at next use.
    machine_cache.forget(_DRAFT_KIND, {**machine_cache.fingerprint(), "target": step_cost_key(runner)})
    return _machine_curve(measured)


def _machine_curve(measured: dict) -> StepCost:
    return StepCost.by_context(measured["latency_ms_by_prefix"],
                               source=f"measured here ({machine_cache.cache_file()})")


def uses_shipped_curve() -> bool:
    """Whether ``SPECDEC_STEP_COST=shipped`` stands in for this machine's measurements.

    Raises
    ------
    ValueError
        ``SPECDEC_STEP_COST`` set to something other than ``machine`` or ``shipped``.
    """
    setting = os.environ.get(_ENV, "machine").strip().lower() or "machine"
    if setting not in ("machine", "shipped"):
        raise ValueError(f"{_ENV} must be 'machine' or 'shipped', got {setting!r}")
    return setting == "shipped"


def machine_step_cost(runner) -> StepCost:
    """``c(T)`` of ``runner``'s model on this machine: read from the machine cache, or
    measured once (:func:`calibrate`, with a note on stderr while it runs); the shipped curve
    under ``SPECDEC_STEP_COST=shipped``.

    Raises
    ------
    ValueError
        ``SPECDEC_STEP_COST`` set to something other than ``machine`` or ``shipped``.
    """
    if uses_shipped_curve():
        return StepCost.load(None)
    found = machine_cache.lookup(_KIND, step_cost_key(runner))
    if found is not None:
        return _machine_curve(found)
    print(f"specdec: measuring this machine's step cost for the model (once; kept in "
          f"{machine_cache.cache_file()})", file=sys.stderr)
    with machine_cache.measuring():
        return calibrate(runner)


def machine_draft_cost(target, draft, exit_layer: int | None = None) -> dict | None:
    """A draft forward's cost in target tokens on this machine (:func:`measure_draft_cost`),
    from the machine cache or measured once; ``None`` under ``SPECDEC_STEP_COST=shipped``
    (the shipped curve is the target's alone).

    Parameters
    ----------
    target, draft : ModelRunner
    exit_layer : int, optional
        The draft's forward leaves after this many layers.

    Returns
    -------
    dict or None
        ``{prefix: {T: ratio}}``.
    """
    if uses_shipped_curve():
        return None
    key = {"target": step_cost_key(target), "draft": step_cost_key(draft, exit_layer),
           "widths": list(DRAFT_WIDTHS), "prefixes": list(PREFIXES)}
    found = machine_cache.lookup(_DRAFT_KIND, key)
    if found is None:
        print(f"specdec: measuring this machine's draft cost against the target (once; kept "
              f"in {machine_cache.cache_file()})", file=sys.stderr)
        with machine_cache.measuring():
            measured = measure_draft_cost(target, draft, exit_layer=exit_layer)
        found = {"ratio_by_prefix": {str(p): {str(t): r for t, r in c.items()}
                                     for p, c in measured.items()}}
        machine_cache.store(_DRAFT_KIND, key, found)
    return {int(p): {int(t): r for t, r in c.items()} for p, c in found["ratio_by_prefix"].items()}
