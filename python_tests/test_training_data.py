"""The prompts the self-distillation data is made from, and the order of a cache's chunks."""

import json
from pathlib import Path

import pytest

from specdec_kernels.training.prompts import (
    SOURCE_LANGUAGES,
    first_stage_prompts,
    second_stage_prompts,
    task_prompts,
)
from specdec_kernels.training.selfdistill import answered, chunk_jobs

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


@pytest.mark.parametrize("first,second,tasks", [(18, 7, 9), (5, 0, 0), (1, 3, 2), (4, 4, 4)])
def test_chunk_jobs_hold_every_chunk_once_in_order(first, second, tasks):
    jobs = chunk_jobs(first, second, tasks)
    for stage, n in (("first", first), ("second", second), ("tasks", tasks)):
        assert [i for s, i in jobs if s == stage] == list(range(n))
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
