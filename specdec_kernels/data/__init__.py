"""Prompts for tests, demos and benchmarks: the 240 Spec-Bench dev questions shipped with the
package (``prompts_dev.jsonl``, Apache-2.0, see ``LICENSE.spec-bench-questions.txt``), so
everything runs without network access or files outside the package."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DEV_PROMPTS", "load_prompts"]

#: The packaged dev question set.
DEV_PROMPTS = Path(__file__).with_name("prompts_dev.jsonl")


def load_prompts(path: str | Path | None = None) -> list:
    """Questions as dicts (``question_id``, ``category``, ``turns``, ...), in file order.

    Parameters
    ----------
    path : str or Path, optional
        A Spec-Bench style JSON-lines file; :data:`DEV_PROMPTS` when omitted.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    """
    path = Path(path) if path else DEV_PROMPTS
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
