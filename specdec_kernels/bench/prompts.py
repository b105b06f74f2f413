"""The benchmark prompts: Spec-Bench's question set (240 prompts, 6 categories).

Spec-Bench reports six categories; MT-bench's eight sub-categories count as one,
``mt_bench``, as in Spec-Bench's own tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: Report order of the categories.
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
_MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
_FILE = "prompts_dev.jsonl"


@dataclass(frozen=True)
class Prompt:
    question_id: int
    category: str
    text: str


def default_prompt_file() -> Path:
    """The packaged copy of the dev prompts (``specdec_kernels/data``)."""
    return Path(__file__).resolve().parents[1] / "data" / _FILE


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """Every prompt of a Spec-Bench style JSONL file (first turn only)."""
    path = Path(path) if path else default_prompt_file()
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                category = "mt_bench" if row["category"] in _MT_BENCH else row["category"]
                prompts.append(Prompt(int(row["question_id"]), category, row["turns"][0]))
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
