"""The GPU projection (``bench.projection``): step-cost interpolation and the projected
speedup tau * c(1) / (c(W) + draft) from a harness result and a cost curve."""

import pytest

from bench.cost_curve import build_model, step_latencies
from bench.projection import interpolate, markdown, mean_step_cost, project

CURVE = {
    "device": "test device",
    "dtype": "bfloat16",
    "prefix": 512,
    "models": {"135m": {"layers": 30, "latency_ms": {"1": 10.0, "4": 12.0, "16": 20.0}}},
}


def test_interpolate_is_linear_between_points_and_clamped():
    latency = CURVE["models"]["135m"]["latency_ms"]
    assert interpolate(latency, 1) == 10.0
    assert interpolate(latency, 2.5) == pytest.approx(11.0)
    assert interpolate(latency, 10) == pytest.approx(16.0)
    assert interpolate(latency, 0.5) == 10.0
    assert interpolate(latency, 64) == 20.0


def test_step_cost_averages_over_the_recorded_widths():
    latency = CURVE["models"]["135m"]["latency_ms"]
    # Three 1-token steps and one 16-token step: (3 * 10 + 20) / 4, not c(mean W = 4.75).
    assert mean_step_cost(latency, {"1": 3, "16": 1}, 4.75) == pytest.approx(12.5)
    assert mean_step_cost(latency, None, 4.0) == 12.0


def _results(figures, settings=None):
    return {
        "config": {
            "device": "cpu", "target": "default", "target_layers": 30,
            "method_settings": settings or {},
        },
        "figures": {name: {"overall": row} for name, row in figures.items()},
    }


def test_projection_of_each_kind_of_method():
    results = _results(
        {
            "ours-autoregressive": {"tokens_per_step": 1.0, "verify_width": 1.0},
            "ours-prompt-lookup": {
                "tokens_per_step": 2.0, "verify_width": 4.0, "drafter_seconds_per_step": 0.001,
                "speedup": 1.5,
            },
            "ours-self-speculative": {
                "tokens_per_step": 1.5, "verify_width": 2.5, "drafted_depth_per_step": 1.0,
            },
            "ours-draft-model": {"tokens_per_step": 3.0, "verify_width": 5.0},
        },
        {"ours-self-speculative": {"num_layers": 15}},
    )
    rows = {r["method"]: r for r in project(results, CURVE, "135m")}
    assert rows["ours-autoregressive"]["projected_speedup"] == pytest.approx(1.0)
    # 2 tokens per step at c(4) = 12 ms plus 1 ms of host drafting.
    assert rows["ours-prompt-lookup"]["projected_speedup"] == pytest.approx(2 * 10 / 13)
    assert rows["ours-prompt-lookup"]["measured_speedup_here"] == 1.5
    # One draft forward through half the layers: 5 ms, verification c(2.5) = 11 ms.
    assert rows["ours-self-speculative"]["projected_speedup"] == pytest.approx(1.5 * 10 / 16)
    # No cost curve for a separate draft model: listed, not projected.
    assert rows["ours-draft-model"]["projected_speedup"] is None
    table = markdown(list(rows.values()), CURVE, "135m", results)
    assert "test device" in table and "| ours-draft-model |" in table and "—" in table


def test_cost_curve_measures_every_width_on_both_paths():
    model = build_model("135m", "cpu", __import__("torch").float32)
    paths = step_latencies(model, prefix=8, tokens=[1, 3], repeats=1)
    kernels = paths.pop("kernels")  # which CPU linears the engine's path chose (kernel_choice)
    assert kernels["path"] in ("package", "torch") and kernels["reason"]
    assert set(paths) == {"engine", "torch"}
    for latencies in paths.values():
        assert set(latencies) == {1, 3}
        assert all(ms > 0 for ms in latencies.values())
    assert model.config._attn_implementation == "sdpa"  # the engine gave the model back


def test_projection_against_hf_generate_uses_torch_c1():
    curve = {**CURVE, "models": {"135m": {**CURVE["models"]["135m"],
                                          "torch_latency_ms": {"1": 20.0, "4": 30.0}}}}
    results = _results({"ours-autoregressive": {"tokens_per_step": 1.0, "verify_width": 1.0}}, {})
    row = project(results, curve, "135m")[0]
    assert row["projected_vs_hf"] == pytest.approx(20.0 / 10.0)
    assert "projected vs HF generate" in markdown([row], curve, "135m", results)
