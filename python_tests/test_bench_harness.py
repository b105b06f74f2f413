"""The benchmark harness behind ``specdec bench``: prompt selection, grouping, the figures it
reports, and an end-to-end run on the default model."""

import json

import pytest

from specdec_kernels import cli
from specdec_kernels.bench import cli as bench_cli
from specdec_kernels.bench.harness import Measurement, group_prompts, mark_identical
from specdec_kernels.bench.methods import RunRecord
from specdec_kernels.bench.prompts import CATEGORIES, Prompt, load_prompts, select_prompts
from specdec_kernels.bench.report import OVERALL, summarize


def test_dev_prompts_cover_the_six_categories():
    prompts = load_prompts()
    assert len(prompts) == 240
    assert {p.category for p in prompts} == set(CATEGORIES)
    assert all(p.text for p in prompts)


def test_select_prompts_takes_the_first_of_each_category():
    prompts = load_prompts()
    chosen = select_prompts(prompts, 2, ["rag", "qa"])
    assert [p.category for p in chosen] == ["rag", "rag", "qa", "qa"]
    assert chosen[:2] == [p for p in prompts if p.category == "rag"][:2]
    assert len(select_prompts(prompts, None)) == 240


@pytest.mark.parametrize(
    "per_category, categories, message",
    [(2, ["poetry"], "unknown categories"), (0, None, "must be >= 1")],
)
def test_select_prompts_rejects_bad_selections(per_category, categories, message):
    with pytest.raises(ValueError, match=message):
        select_prompts(load_prompts(), per_category, categories)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="prompt file not found"):
        load_prompts(tmp_path / "absent.jsonl")


def test_group_prompts_keeps_categories_apart():
    prompts = [Prompt(i, c, "x") for i, c in enumerate("aaabbc")]
    groups = group_prompts(prompts, 2)
    assert [[p.question_id for p in g] for g in groups] == [[0, 1], [2], [3, 4], [5]]
    assert group_prompts(prompts, 1) == [[p] for p in prompts]
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        group_prompts(prompts, 0)


def _measurement(method, qid, category, tokens, seconds, widths, rows=None, **extra):
    record = RunRecord(
        tokens, seconds, forward_widths=widths, forward_rows=rows or [len(tokens)] * len(widths),
        **extra,
    )
    return Measurement(method, (qid,), category, 0, record)


def test_summarize_figures():
    runs = [
        # The baseline: 4 tokens in 4 forwards (the prefill gives the first), 2 s.
        _measurement("hf-generate", 1, "qa", [[5, 6, 7, 8]], 2.0, [30, 1, 1, 1]),
        # Ours: a prefill of all but the last prompt token, then one step of 4 rows (the
        # pending token and 3 drafts) emits the same 4 tokens; 1 s, drafting 3 deep once.
        _measurement(
            "ours-prompt-lookup", 1, "qa", [[5, 6, 7, 8]], 1.0, [30, 4],
            drafter_seconds=0.25, proposed_at=[1, 1, 1], accepted_at=[1, 1, 1],
            first_token_from_prefill=False,
        ),
    ]
    mark_identical(runs)
    figures = summarize(runs)
    base, ours = figures["hf-generate"][OVERALL], figures["ours-prompt-lookup"]["qa"]
    assert base["tau"] == 1.0 and base["speedup"] == 1.0 and base["tokens_per_second"] == 2.0
    assert ours["tau"] == 2.0
    assert ours["speedup"] == 2.0
    assert ours["drafter_time_share"] == 0.25
    assert ours["acceptance_at"] == [1.0, 1.0, 1.0]
    assert ours["tokens_per_step"] == 4.0
    assert base["tokens_per_step"] == 1.0  # HF's prefill yields the first token
    assert ours["verify_width"] == 4.0
    assert ours["identical"] == 1.0
    assert ours["draft_rate"] == 1.0 and ours["accept_rate"] == 1.0  # one step, drafted, accepted
    assert base["draft_rate"] is None


def test_summarize_counts_batched_requests_per_forward():
    # Two requests decoded together: 3 + 2 tokens; the second finishes after 2 forwards.
    run = _measurement("hf-generate", 1, "qa", [[1, 2, 3], [4, 5]], 1.0, [9, 1, 1], [2, 2, 1])
    row = summarize([run])["hf-generate"][OVERALL]
    assert row["tau"] == 1.0
    assert row["tokens_per_second"] == 5.0


def test_mark_identical_compares_with_the_baseline_of_the_same_prompts():
    runs = [
        _measurement("hf-generate", 1, "qa", [[1, 2]], 1.0, [3, 1]),
        _measurement("ours-autoregressive", 1, "qa", [[1, 2]], 1.0, [3, 1]),
        _measurement("ours-prompt-lookup", 1, "qa", [[1, 3]], 1.0, [3, 1]),
        _measurement("ours-prompt-lookup", 2, "qa", [[1, 3]], 1.0, [3, 1]),
    ]
    mark_identical(runs)
    assert [m.identical for m in runs] == [True, True, False, None]


def test_command_line_lists_the_options_that_differ():
    args = bench_cli.build_parser().parse_args(["--max-new-tokens", "32", "--categories", "qa"])
    assert bench_cli.command_line(args) == "specdec bench --categories qa --max-new-tokens 32"


@pytest.mark.default_model
def test_bench_end_to_end_on_the_default_model(tmp_path, capsys):
    out = tmp_path / "bench"
    code = cli.main(
        ["bench", "--categories", "qa", "--prompts-per-category", "1",
         "--max-new-tokens", "8", "--out", str(out),
         "--methods", "hf-generate,ours-autoregressive,ours-prompt-lookup,"
         "ours-self-speculative,hf-early-exit,ours-lookahead,ours-jacobi"]
    )
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    figures = result["figures"]
    assert set(figures) == {
        "hf-generate", "ours-autoregressive", "ours-prompt-lookup", "ours-self-speculative",
        "hf-early-exit", "ours-lookahead", "ours-jacobi",
    }
    # One target forward per token, the prefill included; our loop prefills all but the last
    # prompt token, which then goes through the same step as every later token.
    assert figures["hf-generate"][OVERALL]["tau"] == 1.0
    assert figures["ours-autoregressive"][OVERALL]["tau"] == pytest.approx(8 / 9)
    for name in ("ours-autoregressive", "ours-prompt-lookup", "ours-self-speculative",
                 "ours-lookahead", "ours-jacobi"):
        assert figures[name][OVERALL]["identical"] == 1.0
        assert figures[name]["qa"]["new_tokens"] == 8
    # Ours and HF's layer skip exit at the same layer.
    layers = result["config"]["method_settings"]["ours-self-speculative"]["num_layers"]
    assert layers == result["config"]["target_layers"] - 2
    assert (out / "results.md").read_text().count("| ours-") >= 3
    for png in ("speedup.png", "acceptance.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "hf-generate" in capsys.readouterr().out


@pytest.mark.default_model
def test_bench_batches_leave_out_hf_assisted(tmp_path, capsys):
    out = tmp_path / "bench"
    cli.main(
        ["bench", "--categories", "qa", "--prompts-per-category", "3", "--batch-size", "2",
         "--max-new-tokens", "6", "--out", str(out)]
    )
    result = json.loads((out / "results.json").read_text())
    assert set(result["figures"]) == {
        "hf-generate", "ours-autoregressive", "ours-prompt-lookup", "ours-self-speculative",
        "ours-lookahead", "ours-jacobi", "ours-medusa", "ours-blockwise", "ours-retrieval",
        "ours-quantized-self", "ours-token-recycling", "ours-suffix", "ours-multi",
        "ours-eagle",
    }
    groups = {tuple(m["question_ids"]) for m in result["measurements"]}
    assert sorted(len(g) for g in groups) == [1, 2]
    ours = result["figures"]["ours-autoregressive"][OVERALL]
    assert ours["prompts"] == 3
    assert result["figures"]["hf-generate"][OVERALL]["tau"] == 1.0
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--batch-size", "2", "--methods", "hf-prompt-lookup"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "specdec: error: ['hf-prompt-lookup'] run at batch size 1 only" in err


@pytest.mark.default_model
def test_bench_sampling_reports_no_identity(tmp_path):
    out = tmp_path / "bench"
    cli.main(
        ["bench", "--categories", "qa", "--max-new-tokens", "6", "--temperature", "0.8",
         "--top-p", "0.9", "--seed", "3", "--out", str(out),
         "--methods", "hf-generate,ours-autoregressive,ours-prompt-lookup"]
    )
    result = json.loads((out / "results.json").read_text())
    assert result["config"]["temperature"] == 0.8
    # Sampled outputs are compared in distribution (the decoding tests), not token for token.
    assert all(m["identical"] is None for m in result["measurements"])
    assert all(m["new_tokens"] >= 1 for m in result["measurements"])
    assert "sampling T=0.8" in (out / "results.md").read_text()
