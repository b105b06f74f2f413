"""Which CPU kernels a model's forwards use: the package's or torch's, measured per machine.

The package's CPU kernels (:func:`~specdec_kernels.ops.small_batch_linear` and the tree
attention) make every decoding and verification forward batch-invariant, so speculative greedy
output equals the package's own autoregressive output bit for bit, and they make verifying
``K`` tokens cost about one. They are tuned for AVX2 and AVX-512; where they are not (the
portable code: ARM, x86 without AVX2), torch's kernels can be faster, and then the default is
torch's. Prompts are different: batch invariance does not matter there, and from some hundred
rows on torch's GEMM (oneDNN's, :func:`~specdec_kernels.decoding.cpu_matmul.gemm_linear`) can
beat the package's kernel (from 512 rows on the 2-core Zen 5 of 2026-11-28), so prefill linears
of at least :attr:`KernelChoice.prefill_gemm_rows` rows go to torch.

Both are decided by :func:`measure_linears`, a quick check (well under a second for the default
model) of the model's own weight shapes along both paths, run once per machine, thread count
and shape set and kept by :mod:`~specdec_kernels.decoding.machine_cache`.
``SPECDEC_CPU_KERNELS=package`` or ``torch`` fixes the choice instead (``auto``, the default,
measures).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec_kernels import ops
from specdec_kernels.decoding import machine_cache
from specdec_kernels.decoding.cpu_matmul import GEMM_LIBRARY, gemm_linear
from specdec_kernels.models.quantized_weight import QuantizedWeight

__all__ = ["KernelChoice", "choose", "decide", "linear_weights", "measure_linears"]

#: Rows of the decoding / verification forwards timed by the check.
DECODE_ROWS = (1, 8)
#: Rows of the prefill forwards timed by the check (the prefill threshold is one of them).
PREFILL_ROWS = (32, 128, 512)
#: Weight bytes per timed decoding pass: more than a last-level cache holds, so the pass
#: streams from memory as a decoding step does.
DECODE_PASS_BYTES = 256 << 20
#: Rows of a weight timed in the prefill check (compute-bound: a slice times the same per row).
PREFILL_WEIGHT_ROWS = 4096
_ENV = "SPECDEC_CPU_KERNELS"
_CHOICES = ("auto", "package", "torch")


@dataclass(frozen=True)
class KernelChoice:
    """The kernels of a model's forwards.

    Attributes
    ----------
    package : bool
        Decoding and verification forwards run the package's batch-invariant CPU kernels
        (else torch's linears and the model's own attention).
    prefill_gemm_rows : int or None
        With ``package``: prefill linears of at least this many rows run torch's GEMM
        (None: none do).
    reason : str
        How it was decided.
    isa : str
        The instruction set of the package's CPU kernels (:func:`~specdec_kernels.ops.cpu_isa`),
        or ``"-"`` off CPU.
    """

    package: bool
    prefill_gemm_rows: int | None
    reason: str
    isa: str = "-"

    @property
    def path(self) -> str:
        """``"package"`` or ``"torch"``."""
        return "package" if self.package else "torch"

    def describe(self) -> dict:
        """JSON-ready summary (engine statistics, bench output)."""
        return {
            "path": self.path,
            "isa": self.isa,
            "prefill_gemm_rows": self.prefill_gemm_rows,
            "reason": self.reason,
        }


def linear_weights(model) -> list:
    """The model's CPU float32 / bfloat16 linear weights in module order (tied ones once);
    weights at a file's precision (:class:`QuantizedWeight`) have only the package's kernel
    and are left out."""
    seen, found = set(), []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or not isinstance(weight, torch.Tensor):
            continue
        if isinstance(weight, QuantizedWeight):
            continue
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in (
            torch.float32, torch.bfloat16
        ):
            continue
        if weight.data_ptr() not in seen:
            seen.add(weight.data_ptr())
            found.append(weight.detach())
    return found


def _pass_ms(linear, weights: list, inputs: dict) -> float:
    start = time.perf_counter()
    for w in weights:
        linear(inputs[w.shape[1]], w)
    return (time.perf_counter() - start) * 1e3


def _time_paths(weights: list, rows: int, repeats: int, torch_linear=F.linear) -> dict:
    """Best-of-``repeats`` ms of one pass over ``weights`` at ``rows`` rows, per path: the
    package's kernel and ``torch_linear`` (alternating, so drift hits both alike)."""
    dtype = weights[0].dtype
    inputs = {k: torch.randn(rows, k).to(dtype) for k in {w.shape[1] for w in weights}}
    paths = {"package": ops.small_batch_linear, "torch": torch_linear}
    best = {name: float("inf") for name in paths}
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms up
            for name, linear in paths.items():
                best[name] = min(best[name], _pass_ms(linear, weights, inputs))
    return {name: round(ms, 4) for name, ms in best.items()}


def measure_linears(weights: list, repeats: int = 3, prefill_weights: list | None = None) -> dict:
    """Time the package's and torch's linears on ``weights`` (a model's, in module order).

    Decoding rows (:data:`DECODE_ROWS`): one pass over the first :data:`DECODE_PASS_BYTES` of
    weights, as a decoding step streams them. Prefill rows (:data:`PREFILL_ROWS`): one weight
    of ``prefill_weights`` (default ``weights``) per distinct shape (at most
    :data:`PREFILL_WEIGHT_ROWS` rows of it), each weighted by how many weights share its shape,
    the package's kernel against torch's GEMM (:func:`~specdec_kernels.decoding.cpu_matmul.gemm_linear`).

    Returns
    -------
    dict
        ``{"decode": {rows: {"package": ms, "torch": ms}}, "prefill": {...}}`` (rows as
        strings, JSON-ready).
    """
    if not weights:
        raise ValueError("no CPU float32/bfloat16 linear weights to measure")
    streamed, total = [], 0
    for w in weights:
        if total >= DECODE_PASS_BYTES:
            break
        streamed.append(w)
        total += w.numel() * w.element_size()
    counts: dict = {}
    prefill_weights = weights if prefill_weights is None else prefill_weights
    for w in prefill_weights:
        counts[tuple(w.shape)] = counts.get(tuple(w.shape), 0) + 1
    shapes = {tuple(w.shape): w[:PREFILL_WEIGHT_ROWS] for w in prefill_weights}
    out = {"decode": {}, "prefill": {}}
    for rows in DECODE_ROWS:
        out["decode"][str(rows)] = _time_paths(streamed, rows, repeats)
    for rows in PREFILL_ROWS:
        weighted = {"package": 0.0, "torch": 0.0}
        for shape, w in shapes.items():
            scale = counts[shape] * shape[0] / w.shape[0]
            for name, ms in _time_paths([w], rows, max(1, repeats - 1), gemm_linear).items():
                weighted[name] += scale * ms
        out["prefill"][str(rows)] = {k: round(v, 4) for k, v in weighted.items()}
    return out


def decide(measured: dict) -> tuple:
    """``(package, prefill_gemm_rows)`` from :func:`measure_linears`'s result: the package's
    kernels when their decoding passes take no longer than torch's in total; prefill linears
    to torch's GEMM from the fewest measured rows where it is faster (at every larger row count
    too)."""
    decode = measured["decode"].values()
    package = sum(t["package"] for t in decode) <= sum(t["torch"] for t in decode)
    gemm_rows = None
    for rows in sorted(measured["prefill"], key=int, reverse=True):
        times = measured["prefill"][rows]
        if times["torch"] >= times["package"]:
            break
        gemm_rows = int(rows)
    return package, gemm_rows


def _prefill_weights(model, weights: list) -> list:
    """``weights`` but the LM head's: a prefill forward needs the last row's logits only."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_weight = getattr(head, "weight", None)
    if not isinstance(head_weight, torch.Tensor):
        return weights
    kept = [w for w in weights if w.data_ptr() != head_weight.data_ptr()]
    return kept or weights


def _shape_key(weights: list) -> dict:
    counts: dict = {}
    for w in weights:
        key = "x".join(map(str, w.shape))
        counts[key] = counts.get(key, 0) + 1
    # Measurements of another prefill GEMM (F.linear, before oneDNN's) are not reused.
    return {"dtype": str(weights[0].dtype).removeprefix("torch."), "shapes": counts,
            "prefill_gemm": GEMM_LIBRARY}


def choose(model, requested: bool | None = None) -> KernelChoice:
    """The kernels of ``model``'s forwards.

    Parameters
    ----------
    model : torch.nn.Module
    requested : bool, optional
        True: the package's kernels (prefill GEMM threshold still measured); False: torch's.
        None: ``SPECDEC_CPU_KERNELS`` if set to ``package`` / ``torch``, else measured
        (:func:`measure_linears`, once per machine and shape set).

    Returns
    -------
    KernelChoice
    """
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return KernelChoice(False, None, "not a CPU model")
    setting = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if setting not in _CHOICES:
        raise ValueError(f"{_ENV} must be one of {_CHOICES}, got {setting!r}")
    isa = ops.cpu_isa()
    if requested is False or (requested is None and setting == "torch"):
        why = "asked for" if requested is False else f"{_ENV}=torch"
        return KernelChoice(False, None, why, isa)
    weights = linear_weights(model)
    if not weights:
        return KernelChoice(True, None, "no float32/bfloat16 linears to measure", isa)
    prefill = _prefill_weights(model, weights)
    times = machine_cache.measured("linear_paths", _shape_key(weights),
                                   lambda: measure_linears(weights, prefill_weights=prefill))
    package, gemm_rows = decide(times)
    decode = {rows: round(t["torch"] / t["package"], 2) for rows, t in times["decode"].items()}
    measured = f"measured on {isa}: torch / package time at decoding rows {decode}"
    if requested is True or setting == "package":
        why = "asked for" if requested is True else f"{_ENV}=package"
        return KernelChoice(True, gemm_rows, f"{why} ({measured})", isa)
    return KernelChoice(package, gemm_rows if package else None, measured, isa)
