"""The step-cost curve is measured on the machine the package runs on (issue 21): once per
machine and model, kept in the machine cache, read by every drafter that sizes a tree, and
remeasured by ``specdec calibrate``."""

import json
import re

import pytest
import torch

from python_tests.decoding_helpers import tiny_model
from specdec_kernels import cli
from specdec_kernels.decoding import ModelRunner, TokenRecyclingDrafter, calibration, machine_cache
from specdec_kernels.decoding.budget import AcceptanceStats
from specdec_kernels.decoding.cost import StepCost


@pytest.fixture
def machine_mode(monkeypatch, tmp_path):
    """Machine curves (the suite's default is the shipped one) in a cache of this test's own."""
    monkeypatch.setenv("SPECDEC_STEP_COST", "machine")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=64, layers=2)


def test_measured_curves_cover_every_prefix_and_width_and_never_fall(model):
    runner = ModelRunner(model)
    try:
        curves = calibration.measure_step_cost(runner, widths=(1, 3, 8, 17), prefixes=(40, 9),
                                               rounds=2)
    finally:
        runner.release()
    assert list(curves) == [9, 40]
    for curve in curves.values():
        assert list(curve) == [1, 3, 8, 17]
        values = list(curve.values())
        assert all(v > 0 for v in values) and values == sorted(values)


def test_a_prefix_past_the_models_positions_is_cut_to_what_fits(model):
    """The tiny model has 512 positions: a 17-row block fits after 495 cached rows at most."""
    runner = ModelRunner(model)
    try:
        assert model.config.max_position_embeddings == 512
        assert calibration.measured_prefixes(runner, (9, 10_000, 600), (1, 17)) == [9, 495]
        assert calibration.measured_prefixes(runner, calibration.PREFIXES) == [256, 384]
    finally:
        runner.release()


def test_measured_once_then_read_from_the_machine_cache(model, machine_mode, monkeypatch, capsys):
    calls = []

    def fake_measure(runner, **kwargs):
        calls.append(runner)
        return {256: {1: 10.0, 8: 12.0, 64: 40.0}, 2048: {1: 11.0, 8: 20.0, 64: 90.0}}

    monkeypatch.setattr(calibration, "measure_step_cost", fake_measure)
    first = ModelRunner(model).step_cost()
    assert "measuring this machine's step cost" in capsys.readouterr().err
    assert first.points == [(1, 10.0), (8, 12.0), (64, 40.0)]  # the short context's
    assert first.prefixes == [256, 2048] and first(8, 2048) == 20.0
    assert first.source.startswith("measured here")
    # Another runner (another process would be the same): read, not measured.
    again = ModelRunner(model).step_cost()
    assert again.by_prefix == first.by_prefix and len(calls) == 1
    assert capsys.readouterr().err == ""
    # Another model shape is another entry.
    ModelRunner(tiny_model("llama", vocab=64, layers=3)).step_cost()
    assert len(calls) == 2
    stored = json.loads(machine_cache.cache_file().read_text())
    assert sum('"kind": "step_cost"' in key for key in stored) == 2


def test_a_given_curve_wins_and_the_shipped_one_on_request(model, machine_mode, monkeypatch):
    monkeypatch.setattr(calibration, "measure_step_cost", lambda *a, **k: pytest.fail("measured"))
    runner = ModelRunner(model)
    assert runner.step_cost({1: 2.0, 4: 3.0}).points == [(1, 2.0), (4, 3.0)]
    monkeypatch.setenv("SPECDEC_STEP_COST", "shipped")
    assert runner.step_cost().points == StepCost.load(None).points
    monkeypatch.setenv("SPECDEC_STEP_COST", "measured")
    with pytest.raises(ValueError, match="SPECDEC_STEP_COST must be 'machine' or 'shipped', got 'measured'"):
        ModelRunner(model).step_cost()


@pytest.mark.parametrize("curve, nodes", [({1: 10.0, 128: 10.0}, 12), ({1: 10.0, 2: 15.0, 128: 3000.0}, 1)])
def test_trees_are_sized_from_the_machine_curve(model, machine_mode, monkeypatch, curve, nodes):
    """Token recycling's template on a flat curve keeps every node it may; on a steep one
    (a third token costs 2.6 steps) a single draft."""
    monkeypatch.setattr(calibration, "measure_step_cost", lambda *a, **k: {256: curve})
    drafter = TokenRecyclingDrafter(max_nodes=12)
    drafter.bind(ModelRunner(model), None)
    assert drafter.describe()["cost_curve"].startswith("measured here")
    stats = AcceptanceStats(priors={drafter.name: 0.9})
    assert len(drafter.template(stats, remaining=10)) - 1 == nodes


def test_specdec_calibrate_measures_again_and_prints_the_curve(model, machine_mode, monkeypatch, capsys):
    import specdec_kernels.models as models

    class Loaded:
        tokenizer, source = None, "tiny"

    Loaded.model = model
    monkeypatch.setattr(models, "load_model", lambda *a, **k: Loaded)
    readings = iter([{256: {1: 5.0, 2: 6.0}, 2048: {1: 5.0, 2: 7.5}},
                     {256: {1: 4.0, 2: 8.0}, 2048: {1: 5.0, 2: 15.0}}])
    monkeypatch.setattr(calibration, "measure_step_cost", lambda *a, **k: next(readings))
    assert cli.main(["calibrate", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    short, long = out.split("after 256 cached tokens:")[1].split("after 2048 cached tokens:")
    assert re.search(r"c\(T\)/c\(1\)\s+1\.00\s+1\.20", short)
    assert re.search(r"c\(T\)/c\(1\)\s+1\.00\s+1\.50", long)
    assert cli.main(["calibrate", "--model", "tiny", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["latency_ms_by_prefix"] == {"256": {"1": 4.0, "2": 8.0},
                                              "2048": {"1": 5.0, "2": 15.0}}
    kept = ModelRunner(model).step_cost()  # the new one is kept
    assert kept.points == [(1, 4.0), (2, 8.0)] and kept(2, 2048) == 15.0


def test_a_quantized_model_has_a_curve_of_its_own():
    """A model at a file's precision costs what its kernel costs: its curve is not the float
    model's (the cache key names the weights' format)."""
    from specdec_kernels.models.quantized_weight import quantize_model

    models = [quantize_model(tiny_model("llama", vocab=64, layers=2, seed=3), bits, 32)
              for bits in (4, 8)]
    models.insert(0, tiny_model("llama", vocab=64, layers=2, seed=3))
    keys = [calibration.step_cost_key(ModelRunner(m)) for m in models]
    assert [k["weights"] for k in keys] == [["Linear"], ["Linear[int4/g32]"], ["Linear[int8/g32]"]]
    assert keys[0] == {**keys[1], "weights": ["Linear"]}


def test_the_direct_forward_has_a_curve_of_its_own():
    """A step through the direct forward costs less than one through the model's modules: the
    cache key says which forward was measured."""
    model = tiny_model("llama", vocab=64, layers=2, seed=3)
    direct = calibration.step_cost_key(ModelRunner(model, cpu_kernels=True))
    own = calibration.step_cost_key(ModelRunner(model, cpu_kernels=True, direct_forward=False))
    torch_path = calibration.step_cost_key(ModelRunner(model, cpu_kernels=False))
    assert (direct["forward"], own["forward"], torch_path["forward"]) == ("direct", "model", "model")
    assert direct == {**own, "forward": "direct"}
    gemma = calibration.step_cost_key(ModelRunner(tiny_model("gemma3", vocab=64), cpu_kernels=True))
    assert gemma["forward"] == "model"


def test_measuring_the_machine_is_left_out_of_the_runs_timings(model, machine_mode, monkeypatch):
    """A chain drafter's first run on a machine measures the step and draft costs inside the
    run (its budget asks for them at the start); the run's seconds (and tokens per second)
    leave that time out and the summary says how long it took, once."""
    import time

    from specdec_kernels.decoding import DraftModelDrafter, generate

    def slow_step_cost(runner, **kwargs):
        time.sleep(0.3)
        return {256: {1: 10.0, 2: 10.5, 4: 11.0, 128: 40.0}}

    def slow_draft_cost(target, draft, **kwargs):
        time.sleep(0.3)
        return {256: {1: 0.2, 2: 0.25, 32: 1.0}}

    monkeypatch.setattr(calibration, "measure_step_cost", slow_step_cost)
    monkeypatch.setattr(calibration, "measure_draft_cost", slow_draft_cost)
    draft = tiny_model("llama", vocab=64, layers=1, seed=1)

    def run():
        start = time.perf_counter()
        out = generate(model, [[1, 2, 3, 4, 5, 1, 2, 3]], drafter=DraftModelDrafter(draft, num_draft=3),
                       max_new_tokens=7, eos_token_id=[])
        return out, time.perf_counter() - start

    first, wall = run()
    assert first.stats.measuring_seconds >= 0.6
    assert 0 < first.stats.seconds <= wall - 0.6
    assert first.stats.prefill_seconds + first.stats.drafter_seconds <= first.stats.seconds
    assert "first measured this machine's costs (0." in first.stats.summary()
    assert first.stats.to_dict()["measuring_seconds"] == first.stats.measuring_seconds
    second, _ = run()  # from the machine cache
    assert second.stats.measuring_seconds == 0 and "measured" not in second.stats.summary()
    assert second.tokens == first.tokens
