"""The ``specdec`` command line and the demo."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec_kernels.models
from python_tests.decoding_helpers import cli_plain_greedy, default_model, dev_prompts, hf_greedy
from specdec_kernels import cli, demo
from specdec_kernels.decoding import runner
from specdec_kernels.models import encode_prompts

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    """``python3 <args>`` in a fresh interpreter, from the repository root."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.default_model
def test_generate_prints_json_with_the_greedy_output(capsys):
    loaded = default_model()
    prompt = dev_prompts()[0]
    expected = cli_plain_greedy(prompt, 8)
    code = cli.main(
        ["generate", prompt, "--drafter", "prompt-lookup", "--max-nodes", "6",
         "--max-new-tokens", "8", "--json"]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == [expected]
    assert out["text"] == [loaded.tokenizer.decode(expected, skip_special_tokens=True)]
    assert out["stats"]["method"] == "prompt-lookup"
    assert out["stats"]["drafter"]["max_nodes"] == 6
    assert out["stats"]["new_tokens"] == len(expected)


@pytest.mark.default_model
@pytest.mark.parametrize(
    "drafter, options, settings",
    [
        ("lookahead", ["--window", "3", "--ngram", "4", "--max-candidates", "2"],
         {"window": 3, "ngram": 4, "max_candidates": 2, "prompt_ngrams": True}),
        ("lookahead", ["--no-prompt-ngrams"], {"prompt_ngrams": False}),
        ("jacobi", ["--num-guesses", "3"], {"num_guesses": 3}),
    ],
)
def test_generate_lookahead_and_jacobi(capsys, drafter, options, settings):
    prompt = dev_prompts()[1]
    expected = cli_plain_greedy(prompt, 10)
    assert cli.main(["generate", prompt, "--drafter", drafter, *options,
                     "--max-new-tokens", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == [expected]
    assert out["stats"]["method"] == drafter
    assert settings.items() <= out["stats"]["drafter"].items()


@pytest.mark.default_model
def test_generate_text_output_and_summary(capsys):
    cli.main(["generate", "Say hi.", "--drafter", "self-speculative", "--layers", "20",
              "--num-draft", "2", "--max-new-tokens", "4"])
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "self-speculative: " in captured.err and "tau" in captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--max-new-tokens", "4"], "give at least one prompt (or --prompts-file)"),
        (["generate", "x", "--drafter", "draft-model"],
         "--drafter draft-model needs --draft-model"),
        (["generate", "x", "--draft-model", "somewhere"], "only used with --drafter draft-model"),
        (["generate", "x", "--num-draft", "3"], "--num-draft does not apply to --drafter prompt"),
        (["generate", "x", "--drafter", "none", "--max-nodes", "3", "--adaptive"],
         "--adaptive, --max-nodes do not apply to --drafter none"),
        (["generate", "x", "--layers", "3"], "--layers does not apply to --drafter prompt-lookup"),
        (["generate", "x", "--drafter", "self-speculative", "--num-draft", "65"],
         "num_draft must be <= 64"),
        (["generate", "x", "--model", "/nonexistent/model"], "no model at /nonexistent/model"),
        (["generate", "--prompts-file", "/nonexistent/p.txt"],
         "prompt file not found: /nonexistent/p.txt"),
        (["generate", "x", "--dtype", "float8"], "unknown dtype 'float8'"),
        (["generate", "x", "--device", "gpu"], "unknown device 'gpu'"),
    ],
)
def test_user_errors_print_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert last.startswith("specdec: error: ") and message in last
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "x", "--device", "cuda"])
    assert exit_.value.code == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_of_user_errors(where):
    argv = ["generate", "x", "--drafter", "jacobi", "--num-guesses", "1000"]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    with pytest.raises(ValueError, match="num_guesses must be <= 255"):
        cli.main(argv)


@pytest.mark.default_model
def test_unexpected_errors_keep_their_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("specdec_kernels.decoding.generate", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["generate", "x"])


def test_user_error_from_a_fresh_process():
    done = _run("-m", "specdec_kernels.cli", "generate", "hi", "--model", "/nonexistent/m")
    assert done.returncode == 2
    assert done.stderr == "specdec: error: no model at /nonexistent/m\n"
    done = _run("-m", "specdec_kernels.cli", "--debug", "generate", "hi", "--model", "/none/m")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "FileNotFoundError: no model at /none/m" in done.stderr


def test_arguments_are_parsed_before_the_heavy_imports():
    done = _run("-X", "importtime", "-m", "specdec_kernels.cli", "generate", "--drafter", "foo")
    assert done.returncode == 2
    assert "invalid choice: 'foo'" in done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "specdec_kernels.cli" in imported
    heavy = {"transformers", "specdec_kernels.decoding", "specdec_kernels.models", "matplotlib"}
    assert not heavy & imported


def _load_with_context(context):
    load = specdec_kernels.models.load_model

    def load_model(*args, **kwargs):
        loaded = load(*args, **kwargs)
        loaded.model.config.max_position_embeddings = context
        return loaded

    return load_model


@pytest.mark.default_model
def test_a_prompt_beyond_the_context(monkeypatch, capsys):
    monkeypatch.setattr(specdec_kernels.models, "load_model", _load_with_context(64))
    prompt = dev_prompts()[7]  # 188 tokens
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", prompt, "--max-new-tokens", "4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("specdec: error: prompt 0 has 188 tokens; with max_new_tokens=4")
    assert "more than the model's context of 64 tokens" in err and "--truncate-prompt" in err

    # With --truncate-prompt: the last 60 tokens, decoded as HF would from them; the long
    # prefill runs in chunks and shows a progress bar.
    monkeypatch.setattr(runner, "PREFILL_CHUNK_TOKENS", 16)
    cli.main(["generate", prompt, "--max-new-tokens", "4", "--truncate-prompt", "--json"])
    captured = capsys.readouterr()
    loaded = default_model()
    kept = encode_prompts(loaded.tokenizer, [prompt])[0][-60:]
    expected = hf_greedy(
        loaded.model, kept, 4, eos_token_id=loaded.model.generation_config.eos_token_id
    )
    assert json.loads(captured.out)["tokens"] == [expected]
    assert "prefill" in captured.err and "tok" in captured.err


def test_prefill_progress_bar_draws_and_closes():
    import io

    out = io.StringIO()
    update = cli.prefill_progress_bar(out)
    for done in (0, 40, 80, 100):
        update(done, 100)
    text = out.getvalue()
    assert "prefill:  40%" in text and "80/100" in text
    assert text.endswith(" \r")  # closed and cleared once done
    update(0, 30)  # the next prefill gets a new bar
    assert out.getvalue()[len(text) :].startswith("\rprefill:   0%")


def test_unknown_subcommand_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])
    assert "invalid choice" in capsys.readouterr().err


def test_demo_ops_part(capsys):
    demo.main(["--ops-only"])
    out = capsys.readouterr().out
    assert "request 0 rows [0.0, 1.0, 2.0, 4.0, 5.0, 5.0, 6.0, 7.0], lens [5, 5]" in out
