"""The benchmark prompts: Spec-Bench's question set (240 prompts, 6 categories).

Spec-Bench reports six categories; MT-bench's eight sub-categories count as one,
``mt_bench``, as in Spec-Bench's own tables.
"""

from __future__ import annotations

import random
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


#: The repeated-task workload's two categories: the first and the second half of its series.
SERIES_HALVES = ("series_1st_half", "series_2nd_half")

#: The repeated task: one instruction, a new record each time (as a batch job or an agent
#: sends them). Generated here, never taken from the benchmark prompts.
REPEATED_TASK = (
    "Convert this order into a JSON object with the keys \"customer\", \"city\", "
    "\"product\", \"quantity\" and \"total_usd\". Answer with the JSON only.\n\n"
    "Order: {customer} from {city} bought {quantity} {product} for {total} dollars."
)
_FIRST = ("Maria", "John", "Aiko", "Peter", "Fatima", "Lucas", "Grace", "Omar", "Elena", "Tom",
          "Priya", "Hugo", "Sara", "Ken", "Ines", "Noah")
_LAST = ("Lopez", "Carter", "Tanaka", "Novak", "Khan", "Silva", "Moreau", "Haddad", "Rossi",
         "Berg", "Iyer", "Dubois", "Lind", "Sato", "Costa", "Meyer")
_CITIES = ("Lisbon", "Denver", "Osaka", "Prague", "Lahore", "Porto", "Lyon", "Cairo", "Turin",
           "Oslo", "Pune", "Ghent", "Malmo", "Kyoto", "Braga", "Bremen")
_PRODUCTS = ("desk lamps", "coffee grinders", "rain jackets", "chess sets", "garden hoses",
             "water bottles", "phone cases", "yoga mats", "tea kettles", "bike helmets")


def repeated_task_prompts(count: int = 16, seed: int = 0) -> list[Prompt]:
    """The repeated-task workload: :data:`REPEATED_TASK` over ``count`` generated orders.

    Question ids are positions in the series (1 first); the first half of the series has
    category ``SERIES_HALVES[0]``, the second ``SERIES_HALVES[1]``.

    Raises
    ------
    ValueError
        ``count < 2`` (a series needs two halves).
    """
    if count < 2:
        raise ValueError(f"the series needs at least 2 requests, got {count}")
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        quantity = rng.randint(2, 9)
        text = REPEATED_TASK.format(
            customer=f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", city=rng.choice(_CITIES),
            quantity=quantity, product=rng.choice(_PRODUCTS),
            total=quantity * rng.randint(8, 60),
        )
        prompts.append(Prompt(i + 1, SERIES_HALVES[2 * i >= count], text))
    return prompts
