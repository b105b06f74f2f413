"""Bad input is refused early and clearly: sizes before anything is allocated, command-line
values as they are parsed (before any model loads), damaged files with an error that names
them, and ``specdec: error: ...`` (exit 2) instead of a traceback. In-process and without a
model unless a test says otherwise."""

import re

import numpy as np
import pytest

from specdec_kernels import cli
from specdec_kernels.decoding import (
    BlockwiseDrafter,
    JacobiDrafter,
    LookaheadDrafter,
    MedusaDrafter,
    PromptLookupDrafter,
    QuantizedSelfDrafter,
    RetrievalDrafter,
    SelfSpeculativeDrafter,
    generate,
)
from specdec_kernels.decoding.drafter import MAX_BLOCK_WIDTH, MAX_CHAIN_DRAFTS
from specdec_kernels.retrieval.datastore import Datastore, build_datastore


def _user_error(argv, capsys) -> str:
    """Run ``specdec ARGV``; it must exit 2 with one ``specdec: error:`` line, no traceback
    and no model loaded. Returns that line."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Loading weights" not in err
    last = err.splitlines()[-1]
    assert last.startswith("specdec: error: "), last
    return last


def _usage_error(argv, capsys) -> str:
    """Like :func:`_user_error` for values argparse refuses (``specdec CMD: error: argument
    --X: ...``)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.match(r"specdec (generate|bench): error: argument ", last), last
    return last


# ------------------------------------------------------------------ sizes, before allocating


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SelfSpeculativeDrafter(num_draft=100000), "num_draft must be <= 64"),
        (lambda: SelfSpeculativeDrafter(adaptive=True, max_draft=1000), "max_draft must be <= 64"),
        (lambda: QuantizedSelfDrafter(num_draft=100000), "num_draft must be <= 64"),
        (lambda: BlockwiseDrafter(num_draft=100000), "num_draft must be <= 4"),
        (lambda: BlockwiseDrafter(num_draft=5), "the heads guess 4 tokens ahead"),
        (lambda: MedusaDrafter(max_nodes=100000), "max_nodes must be <= 255"),
        (lambda: MedusaDrafter(tree=[(0,)] + [(0, r) for r in range(300)]), "302 nodes"),
        (lambda: JacobiDrafter(100000), "num_guesses must be <= 255"),
        (lambda: LookaheadDrafter(window=100, ngram=5, max_candidates=2), "408 tokens"),
        (lambda: PromptLookupDrafter(max_nodes=1000), "max_nodes must be <= 255"),
        (lambda: PromptLookupDrafter(max_ngram=100000), "max_ngram must be <= 64"),
        (lambda: RetrievalDrafter(max_matches=10**7), "max_matches must be <= 4096"),
        (lambda: RetrievalDrafter(max_suffix=10**6), "max_suffix must be <= 256"),
    ],
)
def test_drafter_sizes_have_limits_with_reasons(make, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        make()
    assert "(" in str(error.value) or "tokens" in str(error.value)  # the reason is given


def test_the_limits_are_what_the_engine_allows():
    assert MAX_CHAIN_DRAFTS + 1 <= MAX_BLOCK_WIDTH
    assert SelfSpeculativeDrafter(num_draft=MAX_CHAIN_DRAFTS).max_block_width() <= MAX_BLOCK_WIDTH
    assert JacobiDrafter(MAX_BLOCK_WIDTH - 1).max_block_width() == MAX_BLOCK_WIDTH
    assert PromptLookupDrafter(max_nodes=MAX_BLOCK_WIDTH - 1).max_block_width() == MAX_BLOCK_WIDTH


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--drafter", "blockwise", "--num-draft", "100000"], "num_draft must be <= 4"),
        (["--drafter", "self-speculative", "--num-draft", "100000"], "num_draft must be <= 64"),
        (["--drafter", "quantized-self", "--num-draft", "100000"], "num_draft must be <= 64"),
        (["--drafter", "jacobi", "--num-guesses", "1000"], "num_guesses must be <= 255"),
        (["--drafter", "lookahead", "--window", "1000"], "blocks of"),
        (["--drafter", "medusa", "--max-nodes", "100000"], "max_nodes must be <= 255"),
        (["--drafter", "multi", "--max-nodes", "100000"], "max_nodes must be <= 255"),
    ],
)
def test_generate_refuses_sizes_before_loading_the_model(argv, message, capsys):
    assert message in _user_error(["generate", "x", "--max-new-tokens", "4", *argv], capsys)


@pytest.mark.default_model
def test_self_speculative_layers_are_checked_against_the_target(loaded):
    with pytest.raises(ValueError, match=r"num_layers must be in \[1, 29\] .* target itself"):
        generate(loaded, "hi", drafter=SelfSpeculativeDrafter(num_layers=100000),
                 max_new_tokens=2)


# ------------------------------------------------------------------ arguments, as parsed


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
        (["--temperature", "-1"], "argument --temperature: must be in [0, inf), got -1"),
        (["--temperature", "nan"], "argument --temperature: must be in [0, inf), got nan"),
        (["--top-p", "0"], "argument --top-p: must be in (0, 1], got 0"),
        (["--top-k", "-1"], "argument --top-k: must be >= 0, got -1"),
        (["--min-p", "1"], "argument --min-p: must be in [0, 1), got 1"),
        (["--drafter", "self-speculative", "--num-draft", "0"],
         "argument --num-draft: must be >= 1, got 0"),
        (["--drafter", "lookahead", "--ngram", "1"], "argument --ngram: must be >= 2, got 1"),
        (["--max-new-tokens", "ten"], "argument --max-new-tokens: must be an integer"),
    ],
)
def test_generate_checks_its_arguments_as_they_are_parsed(argv, message, capsys):
    assert message in _usage_error(["generate", "x", *argv], capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
        (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["--temperature", "-0.5"], "argument --temperature: must be in [0, inf)"),
        (["--threads", "0"], "argument --threads: must be >= 1, got 0"),
    ],
)
def test_bench_checks_its_arguments_as_they_are_parsed(argv, message, capsys):
    assert message in _usage_error(["bench", *argv], capsys)


def test_bench_refuses_drafter_sizes_before_loading_the_model(capsys):
    last = _user_error(["bench", "--methods", "hf-generate,ours-self-speculative",
                        "--num-draft", "100000"], capsys)
    assert "num_draft must be <= 64" in last
    last = _user_error(["bench", "--methods", "hf-generate,ours-lookahead", "--window", "999"],
                       capsys)
    assert "blocks of" in last


# ------------------------------------------------------------------ prompts


def test_one_name_for_the_prompts_file(tmp_path):
    from specdec_kernels.bench.cli import build_parser

    bench = build_parser()
    for flag in ("--prompts-file", "--prompt-file"):
        assert bench.parse_args([flag, "p.jsonl"]).prompts_file == "p.jsonl"
    generate_parser = cli.build_parser()
    for flag in ("--prompts-file", "--prompt-file"):
        args = generate_parser.parse_args(["generate", flag, "p.txt"])
        assert args.prompts_file == "p.txt"


@pytest.fixture
def bad_prompt_files(tmp_path):
    files = {
        "no-turns.jsonl": '{"question_id": 1, "category": "qa", "prompt": "hi"}\n',
        "not-json.jsonl": '{"question_id": 1, "category": "qa", "turns": ["fine"]}\n{"turns"\n',
        "empty-turn.jsonl": '{"question_id": 1, "category": "qa", "turns": [""]}\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "latin1.jsonl").write_bytes('{"turns": ["caf\xe9"]}\n'.encode("latin-1"))
    return tmp_path


@pytest.mark.parametrize(
    "name, message",
    [
        ("no-turns.jsonl", "no-turns.jsonl, line 1: no 'turns' field"),
        ("not-json.jsonl", "not-json.jsonl, line 2: not JSON"),
        ("empty-turn.jsonl", 'empty-turn.jsonl, line 1: "turns" must be a list starting with'),
        ("latin1.txt", "latin1.txt is not UTF-8 text"),
        ("latin1.jsonl", "latin1.jsonl is not UTF-8 text"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_bad_prompt_files_are_user_errors_naming_the_file(
    bad_prompt_files, name, message, command, capsys
):
    if command == "bench" and name.endswith(".txt"):
        pytest.skip("the bench reads Spec-Bench JSONL only")
    flag = "--prompts-file" if command == "generate" else "--prompt-file"  # either spelling
    last = _user_error([command, flag, str(bad_prompt_files / name)], capsys)
    assert message in last


def test_the_bench_needs_ids_and_categories(tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text('{"turns": ["hello"]}\n')
    last = _user_error(["bench", "--prompts-file", str(path)], capsys)
    assert "line 1: no 'question_id', 'category' field" in last


@pytest.mark.parametrize("prompt", ["", "   "])
def test_an_empty_prompt_is_refused(prompt, capsys):
    assert "prompt 0 is empty" in _user_error(["generate", prompt], capsys)


@pytest.mark.default_model
def test_generate_refuses_an_empty_text_prompt(loaded):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(loaded, ["Hello", ""], max_new_tokens=2)


# ------------------------------------------------------------------ datastores


VOCAB = 8


@pytest.fixture
def store(tmp_path):
    out = tmp_path / "store"
    docs = [[1, 2, 3, 1, 2, 4, 5], [2, 3, 1, 6], [7, 7, 7, 1, 2]]
    build_datastore(docs, out, fingerprint={"vocab_size": VOCAB})
    return out


def _rewrite(store, name, array):
    np.save(store / name, array)


def test_a_datastore_from_build_passes_its_checks(store):
    ds = Datastore(store)
    assert ds.lookup([1, 2], depth=2, min_suffix=1).continuations


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda s, t, sa: _rewrite(s, "sa.npy", np.where(sa == 0, len(sa) + 5, sa)),
         "sa.npy is not a permutation"),
        (lambda s, t, sa: _rewrite(s, "sa.npy", sa.astype(np.float32)),
         "sa.npy must be a 1-D integer array"),
        (lambda s, t, sa: _rewrite(s, "tokens.npy", t.astype(np.float64)),
         "tokens.npy must be a 1-D integer array"),
        (lambda s, t, sa: (_rewrite(s, "tokens.npy", sa), _rewrite(s, "sa.npy", t)),
         "swapped?"),
        (lambda s, t, sa: _rewrite(s, "sa.npy", np.roll(sa, 3)), "not the suffix array"),
        (lambda s, t, sa: _rewrite(s, "sa.npy", sa[:-1]), "sa.npy has"),
        (lambda s, t, sa: _rewrite(s, "tokens.npy", t[:, None]), "1-D integer array"),
        (lambda s, t, sa: (s / "sa.npy").write_bytes((s / "sa.npy").read_bytes()[:90]),
         "sa.npy is not a plain .npy array"),
        (lambda s, t, sa: (s / "meta.json").write_text("{"), "meta.json is not valid JSON"),
        (lambda s, t, sa: (s / "sa.npy").unlink(), "sa.npy is missing"),
    ],
)
def test_a_damaged_datastore_is_refused_at_load(store, damage, message):
    tokens, sa = np.load(store / "tokens.npy"), np.load(store / "sa.npy")
    damage(store, tokens, sa)
    with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
        Datastore(store)


def test_a_shuffled_suffix_array_is_caught_by_the_sample(store):
    tokens, sa = np.load(store / "tokens.npy"), np.load(store / "sa.npy")
    _rewrite(store, "sa.npy", np.random.default_rng(0).permutation(sa).astype(np.int32))
    with pytest.raises(ValueError, match="not the suffix array"):
        Datastore(store)


def test_a_damaged_datastore_is_a_user_error_before_loading_the_model(store, capsys):
    sa = np.load(store / "sa.npy")
    _rewrite(store, "sa.npy", sa + 1000)  # out of range: an IndexError mid-decode before
    last = _user_error(["generate", "x", "--drafter", "retrieval", "--datastore", str(store)],
                       capsys)
    assert "datastore: " in last and "sa.npy is not a permutation" in last


# ------------------------------------------------------------------ model files


def test_a_truncated_gguf_says_so(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf")
    from specdec_kernels.models import default_gguf_path

    try:
        source = default_gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    cut = tmp_path / "model.gguf"
    with open(source, "rb") as f:
        cut.write_bytes(f.read(source.stat().st_size // 2))
    last = _user_error(["generate", "x", "--model", str(cut)], capsys)
    assert "model.gguf is truncated" in last
    assert not any((tmp_path / "cache").rglob("*.safetensors"))  # nothing converted

