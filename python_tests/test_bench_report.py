"""What the bench reports beside the figures: a run far from its method's others is flagged and
left out (not printed as the headline), the spread of single runs, every method drawn
distinctly, the machine (CPU, ISA path, threads, versions) and the command as it was run."""

import json
from pathlib import Path

import pytest

from specdec_kernels.bench import cli as bench_cli
from specdec_kernels.bench.harness import Measurement
from specdec_kernels.bench.machine import cpu_model, machine_info, machine_line
from specdec_kernels.bench.methods import METHOD_DESCRIPTIONS, RunRecord
from specdec_kernels.bench.prompts import CATEGORIES
from specdec_kernels.bench.report import (
    OUTLIER_FACTOR,
    OVERALL,
    find_outliers,
    markdown,
    method_styles,
    summarize,
    write_reports,
)

METHODS = ["hf-generate", "ours-autoregressive", "ours-prompt-lookup", "ours-blockwise"]
SPEED = {"hf-generate": 1.0, "ours-autoregressive": 1.7, "ours-prompt-lookup": 2.2,
         "ours-blockwise": 1.8}


def _runs(stall=None, repeats=1):
    """Every method on one prompt per category; prompt ``i`` is ``1 + i / 2`` times longer
    to decode. ``stall = (method, category, factor)`` stretches one run."""
    runs = []
    for repeat in range(repeats):
        for i, category in enumerate(CATEGORIES):
            for method in METHODS:
                seconds = (1 + i / 2) * 6.4 / SPEED[method]
                if stall and stall[:2] == (method, category) and repeat == 0:
                    seconds *= stall[2]
                record = RunRecord([[1] * 64], seconds, [20] + [1] * 64, [1] * 65)
                runs.append(Measurement(method, (i,), category, repeat, record))
    return runs


def test_a_stalled_run_is_flagged_and_left_out():
    runs = _runs(stall=("ours-blockwise", "mt_bench", 13.0))
    outliers = find_outliers(runs)
    assert list(outliers) == [("ours-blockwise", (0,), 0)]
    assert outliers[("ours-blockwise", (0,), 0)] > OUTLIER_FACTOR
    figures = summarize(runs, outliers)
    blockwise = figures["ours-blockwise"]
    assert blockwise[OVERALL]["speedup"] == pytest.approx(1.8)  # the headline is unhurt
    assert "mt_bench" not in blockwise  # its only mt_bench run was flagged
    assert figures["ours-prompt-lookup"]["mt_bench"]["speedup"] == pytest.approx(2.2)
    # Without flagging, the stall drags the overall figure far down.
    assert summarize(runs)["ours-blockwise"][OVERALL]["speedup"] < 1.2


def test_differences_between_prompts_are_not_outliers():
    assert find_outliers(_runs()) == {}
    mild = _runs(stall=("ours-prompt-lookup", "translation", OUTLIER_FACTOR * 0.8))
    assert find_outliers(mild) == {}


def test_a_stalled_baseline_run_drops_that_prompt_for_everyone():
    runs = _runs(stall=("hf-generate", "qa", 12.0))
    outliers = find_outliers(runs)
    assert list(outliers) == [("hf-generate", (3,), 0)]
    figures = summarize(runs, outliers)
    for method in METHODS:
        assert "qa" not in figures[method]
        assert figures[method][OVERALL]["speedup"] == pytest.approx(SPEED[method])


def test_the_spread_of_single_runs_is_reported():
    runs = _runs(repeats=2)
    runs[-1].record.seconds *= 1.5  # one run of the last method, slower
    row = summarize(runs)[METHODS[-1]][OVERALL]
    assert row["run_speedup_max"] == pytest.approx(1.8)
    assert row["run_speedup_min"] == pytest.approx(1.8 / 1.5)


def test_the_report_flags_outliers_and_names_the_machine(tmp_path):
    runs = _runs(stall=("ours-blockwise", "mt_bench", 13.0))
    config = {
        "target": "default", "device": "cpu", "dtype": "float32", "prompts": 6,
        "max_new_tokens": 64, "repeats": 1, "batch_size": 1, "temperature": 0.0,
        "date": "2026-11-25", "command": "python3 -m specdec_kernels.bench",
        **machine_info("cpu"),
    }
    write_reports(runs, config, tmp_path)
    text = (tmp_path / "results.md").read_text()
    assert "Command: `python3 -m specdec_kernels.bench`" in text
    assert machine_line(config) in text and config["cpu_isa"] in text
    assert "Flagged runs" in text and "| ours-blockwise | 0 | mt_bench | 0 |" in text
    result = json.loads((tmp_path / "results.json").read_text())
    assert [o["method"] for o in result["outliers"]] == ["ours-blockwise"]
    assert sum(m["outlier"] for m in result["measurements"]) == 1
    for key in ("cpu", "cpu_isa", "threads", "torch", "transformers"):
        assert result["config"][key]
    for png in ("speedup.png", "acceptance.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_markdown_without_outliers_has_no_flagged_section():
    runs = _runs()
    config = {"target": "t", "device": "cpu", "dtype": "float32", "prompts": 6,
              "max_new_tokens": 64, "repeats": 1, "temperature": 0.0, "command": "specdec bench"}
    text = markdown(summarize(runs), config)
    assert "Flagged runs" not in text and "Machine: not recorded" in text


def test_every_method_is_drawn_distinctly():
    methods = list(METHOD_DESCRIPTIONS) + [f"extra-{i}" for i in range(10)]
    styles = method_styles(methods)
    assert len({(s["color"], s["hatch"]) for s in styles.values()}) == len(methods)
    first = methods[:20]
    assert len({styles[m]["color"] for m in first}) == len(first)
    assert len({styles[m]["marker"] for m in methods[:13]}) == 13
    # A method keeps its style whichever others are drawn with it.
    assert method_styles(["ours-multi"])["ours-multi"] == styles["ours-multi"]


def test_the_command_is_the_one_that_was_run():
    args = bench_cli.build_parser().parse_args(["--max-new-tokens", "32"])
    assert bench_cli.command_line(args) == "specdec bench --max-new-tokens 32"
    args.invoked_as = "python3 -m specdec_kernels.bench"  # what main() sets
    assert bench_cli.command_line(args) == "python3 -m specdec_kernels.bench --max-new-tokens 32"


def test_cpu_model_reads_proc_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 9B14 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9B14 96-Core Processor"
    assert cpu_model(Path(tmp_path / "absent"))  # falls back to something
