"""Prompts for tests, demos and benchmarks: the Spec-Bench dev questions (Apache-2.0, see
``LICENSE.spec-bench-questions.txt``).

The full set is read from ``../shared/data/prompts_dev.jsonl`` next to the repository when it
is there; otherwise the 20-question subset bundled here (``prompts_dev_subset.jsonl``, the
questions the tests use) is read.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["BUNDLED_PROMPTS", "load_prompts", "prompts_path"]

BUNDLED_PROMPTS = Path(__file__).with_name("prompts_dev_subset.jsonl")
_REPO_PARENT = Path(__file__).resolve().parents[3]
_SHARED_PROMPTS = _REPO_PARENT / "shared" / "data" / "prompts_dev.jsonl"


def prompts_path() -> Path:
    """The shared full prompt file when present, else the bundled subset."""
    return _SHARED_PROMPTS if _SHARED_PROMPTS.is_file() else BUNDLED_PROMPTS


def load_prompts(path: str | Path | None = None) -> list:
    """Questions as dicts (``question_id``, ``category``, ``turns``, ...), in file order.

    Parameters
    ----------
    path : str or Path, optional
        A JSON-lines file; :func:`prompts_path` when omitted.
    """
    with open(path or prompts_path(), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
