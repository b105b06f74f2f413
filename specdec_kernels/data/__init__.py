"""Prompts for tests, demos and benchmarks: the 240 Spec-Bench dev questions shipped with the
package (``prompts_dev.jsonl``, Apache-2.0, see ``LICENSE.spec-bench-questions.txt``), so
everything runs without network access or files outside the package."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DEV_PROMPTS", "check_prompt_texts", "load_prompts", "prompt_texts"]

#: The packaged dev question set.
DEV_PROMPTS = Path(__file__).with_name("prompts_dev.jsonl")


def _read_lines(path: Path) -> list:
    """The file's lines; a missing file is a ``FileNotFoundError``, one that is not UTF-8
    text a ``ValueError``, both naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(
            f"prompt file {path} is not UTF-8 text (byte {error.start}: {error.reason})"
        ) from None


def load_prompts(path: str | Path | None = None, *, required=("turns",)) -> list:
    """Questions as dicts (``question_id``, ``category``, ``turns``, ...), in file order.

    Every line must be a JSON object with the ``required`` fields; ``turns`` must be a list
    whose first entry is a non-empty string (the prompt).

    Parameters
    ----------
    path : str or Path, optional
        A Spec-Bench style JSON-lines file; :data:`DEV_PROMPTS` when omitted.
    required : sequence of str
        Fields every line must have (the benchmark also needs ``question_id`` and
        ``category``).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        A line that is not such an object, or a file that is not UTF-8; the message names
        the file and the line.
    """
    path = Path(path) if path else DEV_PROMPTS
    rows = []
    for number, line in enumerate(_read_lines(path), 1):
        if not line.strip():
            continue
        where = f"prompt file {path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        missing = [key for key in required if key not in row]
        if missing:
            raise ValueError(
                f"{where}: no {', '.join(repr(k) for k in missing)} field (a Spec-Bench style "
                f'line looks like {{"question_id": 1, "category": "qa", "turns": ["..."]}})'
            )
        turns = row.get("turns")
        if "turns" in required and (not isinstance(turns, list) or not turns
                                    or not isinstance(turns[0], str) or not turns[0].strip()):
            raise ValueError(f'{where}: "turns" must be a list starting with a non-empty prompt')
        rows.append(row)
    return rows


def prompt_texts(path: str | Path) -> list:
    """The prompts of a file: the first turn of every line of a ``.jsonl`` file (see
    :func:`load_prompts`), or every non-blank line of any other text file.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`load_prompts`, naming the file.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        return [row["turns"][0] for row in load_prompts(path)]
    return [line for line in _read_lines(path) if line.strip()]


def check_prompt_texts(texts) -> list:
    """``texts`` as a list, refusing an empty (or blank) prompt: with nothing to answer, a
    chat model given only its template produces generic text, which is never what was
    meant."""
    texts = list(texts)
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"prompt {i} is empty; give the text to answer or continue")
    return texts
