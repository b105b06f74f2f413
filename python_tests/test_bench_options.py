"""``specdec bench`` as a newcomer meets it: the drafter options of ``specdec generate``, the
draft model's own tokenizer, a progress bar that names the run in progress with a steady time
estimate, plots that show the spread of repeats and leave out depths never proposed, and no
transformers deprecation warning from the HF peers."""

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from python_tests.decoding_helpers import default_model
from specdec_kernels import cli
from specdec_kernels.bench.harness import Measurement, run_benchmark
from specdec_kernels.bench.methods import RunRecord, Sampling, build_methods
from specdec_kernels.bench.progress import BenchProgress, RemainingTime
from specdec_kernels.bench.prompts import Prompt
from specdec_kernels.bench.report import (
    OVERALL,
    acceptance_figure,
    acceptance_series,
    markdown,
    speedup_bars,
    speedup_figure,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ progress and estimate


def test_remaining_time_from_per_method_means():
    left = RemainingTime({"fast": 4, "slow": 4})
    assert left.seconds_left() is None  # nothing measured yet
    left.finished("fast", 1.0)
    # A method not run yet is estimated at the mean of the measured methods' means.
    assert left.seconds_left() == pytest.approx(3 * 1.0 + 4 * 1.0)
    left.finished("slow", 10.0)
    left.finished("slow", 12.0)
    assert left.mean("slow") == 11.0
    assert left.seconds_left() == pytest.approx(3 * 1.0 + 2 * 11.0)
    # The run in progress counts from its start, never below zero.
    assert left.seconds_left("slow", elapsed=4.0) == pytest.approx(3 + 22 - 4)
    assert left.seconds_left("fast", elapsed=9.0) == pytest.approx(3 + 22 - 1)


def test_remaining_time_is_steady_when_run_lengths_differ_tenfold():
    # Shuffled interleaved runs of a fast and a 10x slower method: once each has run, the
    # per-method estimate is exact after every run, where a mean over all runs swings.
    durations = {"fast": 1.0, "slow": 10.0, "mid": 3.0}
    order = []
    rng = random.Random(0)
    for _ in range(6):
        names = list(durations)
        rng.shuffle(names)
        order += names
    left = RemainingTime({name: 6 for name in durations})
    swings, errors = [], []
    for i, name in enumerate(order):
        left.finished(name, durations[name])
        truth = sum(durations[n] for n in order[i + 1 :])
        if i >= len(durations) - 1 + 3:  # every method measured
            errors.append(abs(left.seconds_left() - truth))
            done = order[: i + 1]
            overall = sum(durations[n] for n in done) / len(done) * (len(order) - i - 1)
            swings.append(abs(overall - truth))
    assert max(errors) == pytest.approx(0.0)
    assert max(swings) > 5.0  # what a global rate would have shown


class _FakeMethod:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def run(self, prompts, max_new_tokens, sampling):
        self.log.append(("run", self.name))
        return RunRecord([[1] * max_new_tokens for _ in prompts], 0.01, [3, 1], [1, 1])


def test_the_progress_label_names_the_run_in_progress():
    log = []
    methods = {n: _FakeMethod(n, log) for n in ("a", "b", "c")}
    prompts = [Prompt(7, "qa", "x"), Prompt(9, "rag", "y")]

    def progress(method, label, seconds):
        log.append(("start" if seconds is None else "end", method, label))

    run_benchmark(methods, prompts, lambda text: [1, 2], max_new_tokens=2, repeats=2,
                  sampling=Sampling(), progress=progress)
    timed = log[3:]  # after one warm-up run per method, which reports nothing
    assert len(timed) == 3 * 2 * 2 * 3
    for start, run, end in zip(timed[0::3], timed[1::3], timed[2::3]):
        assert start[0] == "start" and run == ("run", start[1]) and end[:3] == ("end", *start[1:])
        assert start[2].startswith(start[1] + " q")


def test_bench_progress_bar_shows_the_current_run_and_the_estimate():
    out = io.StringIO()
    with BenchProgress({"hf-generate": 2, "ours-prompt-lookup": 2}, file=out) as bar:
        assert bar.bar.desc == "warm-up"
        bar("hf-generate", "hf-generate q81", None)
        assert bar.bar.desc == "hf-generate q81"
        bar("hf-generate", "hf-generate q81", 4.0)
        bar("ours-prompt-lookup", "ours-prompt-lookup q81", None)
        assert bar.bar.desc == "ours-prompt-lookup q81"
        assert bar.bar.n == 1
        bar("ours-prompt-lookup", "ours-prompt-lookup q81", 2.0)
        assert bar.remaining.seconds_left() == pytest.approx(6.0)
    text = out.getvalue()
    assert "ours-prompt-lookup q81" in text and "~0:06 left" in text
    assert "<" not in text.split("ours-prompt-lookup q81")[-1]  # no rate-based tqdm estimate


# ------------------------------------------------------------------ figures and plots


def _run(method, repeat, tokens_per_second, category="qa", proposed=(), accepted=()):
    record = RunRecord(
        [[1] * 10], 10 / tokens_per_second, [5] + [1] * 10, [1] * 11,
        proposed_at=list(proposed), accepted_at=list(accepted),
    )
    return Measurement(method, (1,), category, repeat, record)


def _figures(repeats):
    base = [10.0, 12.0, 8.0][:repeats]
    ours = [20.0, 18.0, 24.0][:repeats]
    runs = [_run("hf-generate", r, v) for r, v in enumerate(base)]
    runs += [_run("ours-prompt-lookup", r, v, proposed=[4, 2, 0, 1], accepted=[2, 1, 0, 1])
             for r, v in enumerate(ours)]
    return summarize(runs)


def test_speedup_range_pairs_each_repeat_with_the_baselines():
    row = _figures(3)["ours-prompt-lookup"][OVERALL]
    assert row["repeats"] == 3
    assert row["speedup"] == pytest.approx(20.0 / 10.0)  # medians
    # Per-repeat ratios: 20/10, 18/12, 24/8.
    assert row["speedup_min"] == pytest.approx(1.5) and row["speedup_max"] == pytest.approx(3.0)


def test_speedup_plot_draws_the_range_only_with_repeats():
    from matplotlib.container import BarContainer

    categories, bars, runs = speedup_bars(_figures(3))
    assert categories == ["qa", OVERALL] and runs == 3
    values, lows, highs = bars["ours-prompt-lookup"]
    assert values == [pytest.approx(2.0)] * 2 and lows == [pytest.approx(1.5)] * 2
    assert highs == [pytest.approx(3.0)] * 2
    fig = speedup_figure(_figures(3))
    ax = fig.axes[0]
    assert "median of 3 runs" in ax.get_title() and "min–max" in ax.get_title()
    (container,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert container.errorbar is not None
    segments = container.errorbar.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segments] == [pytest.approx((1.5, 3.0))] * 2

    fig = speedup_figure(_figures(1))
    ax = fig.axes[0]
    assert "1 run" in ax.get_title()
    (container,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert container.errorbar is None


def test_depths_never_proposed_are_not_drawn_as_zero():
    figures = _figures(1)
    row = figures["ours-prompt-lookup"][OVERALL]
    assert row["acceptance_at"] == [0.5, 0.5, None, 1.0]
    assert acceptance_series(figures) == {"ours-prompt-lookup": ([1, 2, 4], [0.5, 0.5, 1.0])}
    (line,) = acceptance_figure(figures).axes[0].get_lines()
    assert list(line.get_xdata()) == [1, 2, 4] and list(line.get_ydata()) == [0.5, 0.5, 1.0]
    config = dict(target="t", device="cpu", dtype="float32", prompts=1, max_new_tokens=10,
                  repeats=1, temperature=0, command="specdec bench")
    text = markdown(figures, config)
    assert "| ours-prompt-lookup | 0.50 | 0.50 | — | 1.00 |" in text
    assert "— : never proposed at that depth." in text


# ------------------------------------------------------------------ methods and options


class _Tokenizer:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_the_draft_model_gets_its_own_tokenizer():
    loaded = default_model()
    same = loaded.tokenizer
    methods = build_methods(
        ["ours-draft-model"], loaded.model, loaded.tokenizer, draft_model=loaded.model,
        draft_tokenizer=same, drafter_options={"draft-model": {"num_draft": 3}},
    )
    drafter = methods["ours-draft-model"].make_drafter()
    assert drafter.tokenizer is same and drafter.num_draft == 3
    other = _Tokenizer({**loaded.tokenizer.get_vocab(), "<not-in-the-target>": 10**6})
    for names in (["ours-draft-model"], ["hf-assisted"]):
        with pytest.raises(ValueError, match="the draft model's tokenizer does not match"):
            build_methods(names, loaded.model, loaded.tokenizer, draft_model=loaded.model,
                          draft_tokenizer=other)


def test_drafter_options_and_linear_mode_reach_our_methods():
    loaded = default_model()
    methods = build_methods(
        ["hf-generate", "ours-prompt-lookup", "ours-self-speculative"],
        loaded.model, loaded.tokenizer, exit_layer=20, cpu_kernels=False,
        drafter_options={
            "prompt-lookup": {"max_nodes": 5},
            "self-speculative": {"num_draft": 2, "adaptive": True, "max_draft": 6,
                                 "confidence_threshold": 0.3},
        },
    )
    assert methods["ours-prompt-lookup"].make_drafter().max_nodes == 5
    drafter = methods["ours-self-speculative"].make_drafter()
    assert (drafter.num_layers, drafter.num_draft, drafter.adaptive, drafter.max_draft,
            drafter.confidence_threshold) == (20, 2, True, 6, 0.3)
    for name in ("ours-prompt-lookup", "ours-self-speculative"):
        assert methods[name].generate_kwargs == {"cpu_kernels": False}
    with pytest.raises(ValueError, match="num_draft must be >= 1"):
        build_methods(["ours-self-speculative"], loaded.model, loaded.tokenizer,
                      drafter_options={"self-speculative": {"num_draft": 0}})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "hf-generate,ours-prompt-lookup", "--num-draft", "3"],
         "--num-draft: no method of this run takes it (hf-generate, ours-prompt-lookup)"),
        (["--methods", "ours-draft-model"], "['ours-draft-model'] need a draft model (--draft)"),
        (["--methods", "hf-frobnicate"], "unknown methods ['hf-frobnicate']"),
        (["--categories", "poetry"], "unknown categories ['poetry']"),
        (["--prompt-file", "/nonexistent.jsonl"], "prompt file not found"),
    ],
)
def test_bench_user_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert last.startswith("specdec: error: ") and message in last
    assert "Traceback" not in err and "Loading weights" not in err  # refused before loading


def test_bench_refuses_a_draft_with_another_tokenizer(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, LlamaConfig

    loaded = default_model()
    tokenizer = loaded.tokenizer.__class__.from_pretrained(loaded.model.config._name_or_path)
    tokenizer.add_tokens(["<draft-only-token>"])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    draft = tmp_path / "draft"
    AutoModelForCausalLM.from_config(config).save_pretrained(draft)
    tokenizer.save_pretrained(draft)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--draft", str(draft), "--categories", "qa", "--max-new-tokens", "2",
                  "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "the draft model's tokenizer does not match the target's" in capsys.readouterr().err


@pytest.mark.default_model
def test_bench_passes_the_drafter_options(tmp_path):
    out = tmp_path / "bench"
    cli.main(["bench", "--categories", "qa", "--max-new-tokens", "6", "--out", str(out),
              "--methods", "hf-generate,ours-self-speculative,ours-prompt-lookup",
              "--num-draft", "2", "--adaptive", "--max-draft", "3", "--max-nodes", "4"])
    result = json.loads((out / "results.json").read_text())
    settings = result["config"]["method_settings"]
    assert settings["ours-self-speculative"]["num_draft"] == 2
    assert settings["ours-self-speculative"]["adaptive"] is True
    assert settings["ours-self-speculative"]["max_draft"] == 3
    assert settings["ours-prompt-lookup"]["max_nodes"] == 4
    assert result["config"]["command"].endswith("--num-draft 2 --adaptive --max-draft 3 "
                                                "--max-nodes 4")
    figures = result["figures"]
    assert figures["ours-self-speculative"][OVERALL]["identical"] == 1.0


# ------------------------------------------------------------------ HF peers' warnings

_HF_PEERS = """
import torch
from python_tests.decoding_helpers import tiny_model
from specdec_kernels.bench.methods import HFMethod, Sampling

class Tok:
    pad_token_id, eos_token_id = 0, None

torch.set_num_threads(1)  # tiny models; the machine may be busy
target, draft = tiny_model(vocab=64, layers=4), tiny_model(vocab=64, layers=2, seed=1)
prompt = [[1, 2, 3, 4, 1, 2, 3]]
if {direct}:
    target.generate(torch.tensor(prompt), max_new_tokens=4, do_sample=False,
                    pad_token_id=0, assistant_model=draft)
else:
    for kwargs in (dict(assistant_early_exit=2), dict(assistant_model=draft),
                   dict(prompt_lookup_num_tokens=3), dict()):
        for sampling in (Sampling(), Sampling(0.8, 0, 0.9, 1)):
            HFMethod("peer", target, Tok(), **kwargs).run(prompt, 4, sampling)
print("ran")
"""


def _python(code):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_hf_peers_print_no_generation_config_warning():
    ours = _python(_HF_PEERS.format(direct=False))
    assert ours.returncode == 0, ours.stderr
    assert "ran" in ours.stdout
    assert "generation_config" not in ours.stderr and "deprecated" not in ours.stderr
    # Where transformers still warns from its own assisted generation, the test can see it.
    direct = _python(_HF_PEERS.format(direct=True))
    assert direct.returncode == 0, direct.stderr
    if "Passing `generation_config` together" not in direct.stderr:
        pytest.skip("this transformers version no longer warns from assisted generation")
