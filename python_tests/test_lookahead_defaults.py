"""Lookahead's default (W, N, G) come from code: ``bench.lookahead_defaults`` over the committed
acceptance table and step-cost curves. A new curve (a faster kernel, another device) changes
them by re-running ``select``; this test fails until ``DEFAULTS`` follows."""

import json
from importlib import resources
from pathlib import Path

import pytest

from bench.lookahead_defaults import flat_curve, ranked, select
from specdec_kernels.decoding.cost import DEFAULT_CURVE
from specdec_kernels.decoding.lookahead import DEFAULTS

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def latest(name: str) -> Path:
    found = sorted(RESULTS.glob(f"*/{name}"))
    assert found, f"no committed {name} under {RESULTS}"
    return found[-1]


def load(name: str) -> dict:
    return json.loads(latest(name).read_text())


def test_cpu_defaults_are_the_best_on_the_shipped_cpu_curve():
    """The CPU curve every drafter sizes itself by (decoding.cost.DEFAULT_CURVE)."""
    shipped = resources.files("specdec_kernels.data").joinpath(DEFAULT_CURVE).read_text()
    assert DEFAULTS["cpu"] == select(load("lookahead-acceptance.json"), json.loads(shipped))


def test_gpu_defaults_follow_the_gpu_curve_or_a_flat_one():
    table = load("lookahead-acceptance.json")
    gpu = sorted(RESULTS.glob("*/curve-gpu.json"))
    curve = json.loads(gpu[-1].read_text()) if gpu else flat_curve(table)
    assert DEFAULTS["cuda"] == select(table, curve)


def _row(window, ngram, candidates, tokens, widths):
    return {"window": window, "ngram": ngram, "max_candidates": candidates, "tokens": tokens,
            "steps": sum(widths.values()), "widths": {str(w): n for w, n in widths.items()}}


TABLE = {"configs": [
    _row(1, 3, 1, 120, {2: 100}),   # 1.2 tokens per step on 2-token blocks
    _row(8, 5, 8, 200, {60: 100}),  # 2.0 tokens per step on 60-token blocks
]}


def _curve(latencies):
    return {"device": "test", "dtype": "float32", "prefix": 0,
            "models": {"135m": {"latency_ms": {str(t): c for t, c in latencies.items()}}}}


def test_select_trades_tokens_per_step_against_step_cost():
    steep = _curve({1: 10.0, 2: 11.0, 64: 40.0})
    rows = ranked(TABLE, steep)
    assert rows[0]["window"] == 1
    assert rows[0]["speedup"] == pytest.approx(120 * 10.0 / (100 * 11.0))
    assert rows[0]["tokens_per_step"] == 1.2 and rows[0]["mean_width"] == 2.0
    assert select(TABLE, flat_curve(TABLE)) == {"window": 8, "ngram": 5, "max_candidates": 8}
    with pytest.raises(ValueError, match="curve stops at 32"):
        ranked(TABLE, _curve({1: 10.0, 32: 20.0}))
