"""The prompts the self-distillation data is made from, and the order of a cache's chunks."""

import json
from pathlib import Path

import pytest

from specdec_kernels.training.prompts import (
    SOURCE_LANGUAGES,
    benchmark_ngrams,
    first_stage_prompts,
    second_stage_prompts,
    shares_benchmark_text,
    task_prompts,
)
from specdec_kernels.training.selfdistill import (
    MIN_REQUEST_WORDS,
    answered,
    chunk_jobs,
    self_written_prompts,
    usable_request,
    user_turn_prefix,
)

DEV = Path(__file__).resolve().parents[1] / "specdec_kernels" / "data" / "prompts_dev.jsonl"

LONG = ("Volcanoes form where magma rises through the crust. Most of them sit along the edges "
        "of tectonic plates. An eruption can change the weather of a whole year. ") * 4


@pytest.mark.parametrize("count", [1, 7, 64])
def test_task_prompts_count_and_seed(count):
    sources = [("Write about volcanoes.", LONG), ("Translate to German: Hello.", "Hallo, "
               "wie geht es dir heute, mein Freund?")]
    first = task_prompts(sources, count, seed=4)
    assert len(first) == count and all(isinstance(p, str) and p for p in first)
    assert first == task_prompts(sources, count, seed=4)
    assert first != task_prompts(sources, count, seed=5) or count == 1


def test_task_prompts_cover_the_forms_users_send():
    german = "Die Vulkane entstehen dort, wo das Magma durch die Erdkruste aufsteigt."
    sources = [("Explain volcanoes.", LONG), ("Translate English to German: Volcanoes form.",
                                              german)]
    prompts = task_prompts(sources, 400, seed=0)
    starts = lambda prefix: [p for p in prompts if p.startswith(prefix)]  # noqa: E731
    assert starts("Translate German to English: ") and all(
        p == f"Translate German to English: {german}" for p in starts("Translate German to"))
    assert any(p.startswith(f"Translate English to {lang}: ") for p in prompts
               for lang in SOURCE_LANGUAGES)  # the sources of later translations
    assert starts("Summarize: ") and all(len(p) > len(LONG) for p in starts("Summarize: "))
    coding = [p for p in prompts if any(lang in p for lang in ("Python", "C++", "Java"))]
    word_problems = [p for p in prompts if "$" in p or "students" in p or "pages" in p]
    questions = [p for p in prompts if p.endswith("?") and len(p) < 80]
    extraction = [p for p in prompts if "JSON" in p and LONG.split(".")[0] in p]
    passage = [p for p in prompts if p.startswith(LONG.split(".")[0]) and "?" in p]
    for kind in (coding, word_problems, questions, extraction, passage):
        assert len(kind) >= 20, kind[:3]


def test_task_prompts_without_earlier_answers_skip_the_text_forms():
    prompts = task_prompts([], 50, seed=1)
    assert len(prompts) == 50
    assert not [p for p in prompts if p.startswith(("Summarize:", "Translate German"))]


def test_no_generated_prompt_is_a_benchmark_prompt():
    """The data never holds the benchmark's prompts (prompts_dev.jsonl is what bench runs)."""
    dev = {t for line in DEV.read_text().splitlines() for t in json.loads(line)["turns"]}
    first = first_stage_prompts(300, seed=0)
    made = first + second_stage_prompts([LONG] * 3, 100) + task_prompts(
        [(p, LONG) for p in first[:5]], 300)
    assert not dev & set(made)


@pytest.mark.parametrize("first,second,tasks,own", [(18, 7, 9, 0), (5, 0, 0, 0), (1, 3, 2, 5),
                                                   (4, 4, 4, 4), (9, 7, 12, 32)])
def test_chunk_jobs_hold_every_chunk_once_in_order(first, second, tasks, own):
    jobs = chunk_jobs(first, second, tasks, own)
    for stage, n in (("first", first), ("second", second), ("tasks", tasks), ("self", own)):
        assert [i for s, i in jobs if s == stage] == list(range(n))
    assert len(jobs) == first + second + tasks + own
    assert jobs[0] == ("first", 0)  # the later stages build on the first stage's answers


def test_chunk_jobs_keep_the_order_of_caches_made_before_the_task_stage():
    """A cache made with only two stages resumes with its chunks where they were."""
    jobs = chunk_jobs(18, 7, 0)
    assert [j for j in jobs if j[0] == "second"][0] == ("second", 0)
    assert jobs.index(("second", 0)) == 2 and jobs.index(("second", 6)) == 20


def test_answered_reads_the_chunks_json(tmp_path):
    for stage, prompts, answers in (("first", ["a", "b"], ["A", "B"]), ("tasks", ["c"], ["C"])):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "chunk_0000.json").write_text(
            json.dumps({"prompts": prompts, "answers": answers}))
    (tmp_path / "eagle-train" / "x").mkdir(parents=True)  # not a stage: never read
    (tmp_path / "eagle-train" / "x" / "chunk_0000.json").write_text("not json")
    assert answered(tmp_path) == [("a", "A"), ("b", "B"), ("c", "C")]
    assert answered(tmp_path / "first") == [("a", "A"), ("b", "B")]


def test_chunk_jobs_keep_the_order_of_caches_made_before_the_self_stage():
    """Adding self-written chunks leaves where the other stages' chunks were in the order."""
    before = chunk_jobs(9, 7, 12)
    after = [job for job in chunk_jobs(9, 7, 12, 32) if job[0] != "self"]
    assert after == before


# ---------------------------------------------------------------------------- self-written prompts


def _dev_turns():
    return [t for line in DEV.read_text().splitlines() for t in json.loads(line)["turns"]]


def test_every_benchmark_turn_shares_benchmark_text_even_inside_other_text():
    grams = benchmark_ngrams()
    for turn in _dev_turns():
        assert shares_benchmark_text(turn, grams), turn
        assert shares_benchmark_text(f"Hello! {turn.upper()} Thanks a lot.", grams), turn


def test_shares_benchmark_text_leaves_other_requests():
    grams = benchmark_ngrams()
    made = first_stage_prompts(200, seed=3) + task_prompts([], 100, seed=3)
    assert sum(shares_benchmark_text(p, grams) for p in made) <= 2
    assert not shares_benchmark_text("Can you give me tips on how to improve my public "
                                     "speaking skills before my next talk?", grams)
    assert not shares_benchmark_text("", grams)
    # A short turn counts whole, inside other text too, never a part of it.
    assert shares_benchmark_text("Please prove the Pythagorean theorem for me.", grams)
    assert not shares_benchmark_text("Prove the theorem.", grams)


@pytest.mark.parametrize("text,reason,ok", [
    ("Can you recommend a good book about the history of Rome?", "eos", True),
    ("Can you recommend a good book about the history of Rome?", "length", False),  # cut off
    ("Hi there!", "eos", False),  # fewer than MIN_REQUEST_WORDS words
    ("Already asked in an earlier chunk, here it is", "eos", False),
    ("Prove the Pythagorean theorem.", "eos", False),  # a benchmark prompt
])
def test_usable_request(text, reason, ok):
    seen = {"Already asked in an earlier chunk, here it is"}
    assert usable_request(text, reason, seen, benchmark_ngrams()) is ok
    assert len("Hi there!".split()) < MIN_REQUEST_WORDS


def test_user_turn_prefix_needs_a_chat_template():
    class Plain:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        user_turn_prefix(Plain())


@pytest.mark.default_model
def test_self_written_prompts_open_a_user_turn_and_are_usable(loaded):
    tokenizer = loaded.tokenizer
    prefix = user_turn_prefix(tokenizer)
    whole = tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                    tokenize=False),
                      add_special_tokens=False)["input_ids"]
    assert whole[: len(prefix)] == prefix and tokenizer.decode(prefix).endswith("user\n")
    first = self_written_prompts(loaded, 3, seed=5)
    assert first == self_written_prompts(loaded, 3, seed=5)  # seeded
    assert 1 <= len(first) <= 3 and len(set(first)) == len(first)
    grams = benchmark_ngrams()
    assert all(usable_request(p, "eos", set(), grams) for p in first)
    assert not set(first) & set(_dev_turns())
    assert not set(first) & set(self_written_prompts(loaded, 3, seed=5, exclude=first))
