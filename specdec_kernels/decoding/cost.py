"""The step-cost doorway: the measured cost ``c(T)`` of one target forward over ``T`` tokens
per request, from which drafters size their blocks (a tree's node count, a chain's length).

A step's cost also grows with the context its attention reads: on the development CPU an
extra verified token cost 0.78 ms after 256 cached tokens and 2.04 ms after 2048 (2026-12-04),
so a tree sized at a short context is too big at a long one. A curve measured at several
context lengths (:meth:`StepCost.by_context`, what the machine calibration keeps) answers
``c(T, context)``, linear in the context between them (attention is linear in the keys it
reads) and beyond the longest; a curve of one context answers the same at every context.

Curves are the JSON written by ``python3 -m bench.cost_curve`` (``models -> name ->
latency_ms -> {T: ms}``), or a plain ``{T: ms}`` mapping. The package ships the curve measured
on its development CPU for the default model's shape
(``specdec_kernels/data/step_cost/cpu-135m.json``); pass a new one to re-derive every size
(e.g. after a kernel change, or for a GPU).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

__all__ = ["DEFAULT_CURVE", "StepCost"]

#: The shipped curve (package data), in ``bench.cost_curve``'s format.
DEFAULT_CURVE = "step_cost/cpu-135m.json"


class StepCost:
    """``c(T)`` in milliseconds, linear between measured points, clamped past the ends; with
    curves at several contexts (:meth:`by_context`), ``c(T, context)`` as well.

    Parameters
    ----------
    latency_ms : dict
        ``{T: ms}`` measured points (``T >= 1``; keys may be strings).
    source : str
        Where the points came from (for reports).
    """

    def __init__(self, latency_ms: dict, source: str = ""):
        self.points = _points(latency_ms)
        self.source = source
        #: ``[(context, points)]`` by increasing context; one entry: context does not matter.
        self.by_prefix: list = [(None, self.points)]

    @classmethod
    def by_context(cls, latency_ms_by_prefix: dict, source: str = "") -> "StepCost":
        """A curve measured after several cached prefixes.

        Parameters
        ----------
        latency_ms_by_prefix : dict
            ``{prefix: {T: ms}}`` (keys may be strings), ``prefix >= 0`` cached tokens before
            the measured block; the shortest prefix's curve is :attr:`points` (the answer for
            ``context=None``).
        source : str

        Raises
        ------
        ValueError
            No curves, a negative prefix, or a curve with no positive costs.
        """
        curves = sorted((int(p), _points(c)) for p, c in latency_ms_by_prefix.items())
        if not curves or curves[0][0] < 0:
            raise ValueError(f"latency_ms_by_prefix needs curves at prefixes >= 0, got "
                             f"{sorted(latency_ms_by_prefix)}")
        out = cls(dict(curves[0][1]), source)
        out.by_prefix = curves
        return out

    def __call__(self, width: float, context: float | None = None) -> float:
        """``c(width)`` after ``context`` cached tokens (``None``: the shortest measured).

        Between two measured contexts the cost is linear in the context; past the longest it
        goes on along the last two (never falling); before the shortest it is the shortest's.
        """
        curves = self.by_prefix
        if context is None or len(curves) == 1 or context <= curves[0][0]:
            return _interpolate(curves[0][1], width)
        # The two measured contexts around it, or the last two past the longest.
        i = next((i for i, (p, _) in enumerate(curves) if context <= p), len(curves) - 1)
        (p0, c0), (p1, c1) = curves[i - 1], curves[i]
        low, high = _interpolate(c0, width), _interpolate(c1, width)
        return low + max(high - low, 0.0) * (context - p0) / (p1 - p0)

    @property
    def prefixes(self) -> list:
        """The contexts measured (``[None]`` for a curve of one context)."""
        return [p for p, _ in self.by_prefix]

    @classmethod
    def load(cls, curve=None, model: str | None = None) -> "StepCost":
        """A curve from a ``bench.cost_curve`` JSON file or dict, a ``{T: ms}`` dict, a
        ``{"latency_ms_by_prefix": {prefix: {T: ms}}}`` dict or file (:meth:`by_context`, as
        the machine calibration keeps it), a :class:`StepCost`, or ``None`` (the shipped
        default).

        Parameters
        ----------
        curve : str, Path, dict, StepCost or None
        model : str, optional
            Which model of a multi-model curve (default: the only one, else ``"135m"``).
        """
        if isinstance(curve, StepCost):
            return curve
        source = "specdec_kernels/data/" + DEFAULT_CURVE if curve is None else str(curve)
        if curve is None:
            text = resources.files("specdec_kernels.data").joinpath(DEFAULT_CURVE).read_text()
            curve = json.loads(text)
        elif isinstance(curve, (str, Path)):
            path = Path(curve)
            if not path.is_file():
                raise FileNotFoundError(f"no step-cost curve at {path}")
            curve = json.loads(path.read_text())
        if not isinstance(curve, dict):
            raise ValueError(f"a step-cost curve must be a dict or a JSON file, got {curve!r}")
        if "latency_ms_by_prefix" in curve:
            return cls.by_context(curve["latency_ms_by_prefix"], source)
        if "models" in curve:
            models = curve["models"]
            if model is None:
                model = next(iter(models)) if len(models) == 1 else "135m"
            if model not in models:
                raise ValueError(f"the curve has no model {model!r} (has {sorted(models)})")
            curve = models[model]["latency_ms"]
        return cls(curve, source)


def _points(latency_ms: dict) -> list:
    """``[(T, ms)]`` sorted, checked."""
    points = sorted((int(t), float(ms)) for t, ms in latency_ms.items())
    if not points or points[0][0] < 1 or any(ms <= 0 for _, ms in points):
        raise ValueError(f"a step-cost curve needs positive costs at T >= 1, got {latency_ms}")
    return points


def _interpolate(points: list, width: float) -> float:
    if width <= points[0][0]:
        return points[0][1]
    for (t0, c0), (t1, c1) in zip(points, points[1:]):
        if width <= t1:
            return c0 + (c1 - c0) * (width - t0) / (t1 - t0)
    return points[-1][1]
