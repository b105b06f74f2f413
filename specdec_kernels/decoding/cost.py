"""The step-cost doorway: the measured cost ``c(T)`` of one target forward over ``T`` tokens
per request, from which drafters size their blocks (a tree's node count, a chain's length).

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
    """``c(T)`` in milliseconds, linear between measured points, clamped past the ends.

    Parameters
    ----------
    latency_ms : dict
        ``{T: ms}`` measured points (``T >= 1``; keys may be strings).
    source : str
        Where the points came from (for reports).
    """

    def __init__(self, latency_ms: dict, source: str = ""):
        points = sorted((int(t), float(ms)) for t, ms in latency_ms.items())
        if not points or points[0][0] < 1 or any(ms <= 0 for _, ms in points):
            raise ValueError(f"a step-cost curve needs positive costs at T >= 1, got {latency_ms}")
        self.points = points
        self.source = source

    def __call__(self, width: float) -> float:
        points = self.points
        if width <= points[0][0]:
            return points[0][1]
        for (t0, c0), (t1, c1) in zip(points, points[1:]):
            if width <= t1:
                return c0 + (c1 - c0) * (width - t0) / (t1 - t0)
        return points[-1][1]

    @classmethod
    def load(cls, curve=None, model: str | None = None) -> "StepCost":
        """A curve from a ``bench.cost_curve`` JSON file or dict, a ``{T: ms}`` dict, a
        :class:`StepCost`, or ``None`` (the shipped default).

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
        if "models" in curve:
            models = curve["models"]
            if model is None:
                model = next(iter(models)) if len(models) == 1 else "135m"
            if model not in models:
                raise ValueError(f"the curve has no model {model!r} (has {sorted(models)})")
            curve = models[model]["latency_ms"]
        return cls(curve, source)
