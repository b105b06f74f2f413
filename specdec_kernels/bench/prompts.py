"""The benchmark prompts: Spec-Bench's question set (240 prompts, 6 categories).

Spec-Bench reports six categories; MT-bench's eight sub-categories count as one,
``mt_bench``, as in Spec-Bench's own tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec_kernels import data

#: Report order of the categories.
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
_MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


@dataclass(frozen=True)
class Prompt:
    question_id: int
    category: str
    text: str


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """Every prompt of a Spec-Bench style JSONL file (first turn only; the packaged dev set
    when ``path`` is omitted).

    Raises
    ------
    FileNotFoundError, ValueError
        See :func:`specdec_kernels.data.load_prompts` (every line needs ``question_id``,
        ``category`` and ``turns``).
    """
    rows = data.load_prompts(path, required=("question_id", "category", "turns"))
    prompts = []
    for row in rows:
        if isinstance(row["question_id"], bool) or not isinstance(row["question_id"], int):
            raise ValueError(f"prompt file {path}: question_id {row['question_id']!r} is not an "
                             "integer")
        category = row["category"]
        prompts.append(Prompt(row["question_id"],
                              "mt_bench" if category in _MT_BENCH else str(category),
                              row["turns"][0]))
    return prompts


def select_prompts(
    prompts: list[Prompt], per_category: int | None, categories: list[str] | None = None
) -> list[Prompt]:
    """The first ``per_category`` prompts of each category (all when None), in file order.

    Raises
    ------
    ValueError
        An unknown category, or a selection that leaves no prompt.
    """
    wanted = list(categories) if categories else list(CATEGORIES)
    unknown = sorted(set(wanted) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"unknown categories {unknown}; choose from {list(CATEGORIES)}")
    if per_category is not None and per_category < 1:
        raise ValueError(f"prompts per category must be >= 1, got {per_category}")
    chosen = []
    for category in wanted:
        of_category = [p for p in prompts if p.category == category]
        chosen += of_category if per_category is None else of_category[:per_category]
    if not chosen:
        raise ValueError("the prompt selection is empty")
    return chosen
