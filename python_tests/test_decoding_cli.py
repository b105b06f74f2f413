"""The ``specdec`` command line and the demo."""

import json

import pytest

from python_tests.decoding_helpers import default_model, dev_prompts, hf_greedy
from specdec_kernels import cli, demo
from specdec_kernels.models import encode_prompts


def test_generate_prints_json_with_the_greedy_output(capsys):
    loaded = default_model()
    prompt = dev_prompts()[0]
    expected = hf_greedy(
        loaded.model, encode_prompts(loaded.tokenizer, [prompt])[0], 8,
        eos_token_id=loaded.model.generation_config.eos_token_id,
    )
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


def test_generate_text_output_and_summary(capsys):
    cli.main(["generate", "Say hi.", "--drafter", "self-speculative", "--layers", "20",
              "--num-draft", "2", "--max-new-tokens", "4"])
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "self-speculative: " in captured.err and "tau" in captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--max-new-tokens", "4"], "at least one prompt"),
        (["generate", "x", "--drafter", "draft-model"], "needs --draft-model"),
        (["generate", "x", "--draft-model", "somewhere"], "only used with --drafter draft-model"),
    ],
)
def test_generate_usage_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        cli.main(argv)


def test_unknown_subcommand_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])
    assert "invalid choice" in capsys.readouterr().err


def test_demo_ops_part(capsys):
    demo.main(["--ops-only"])
    out = capsys.readouterr().out
    assert "request 0 rows [0.0, 1.0, 2.0, 4.0, 5.0, 5.0, 6.0, 7.0], lens [5, 5]" in out
