"""Corpora for datastores: reading text / JSONL files, and making a corpus of the target's
own answers to requests built from the package's topic list and templates (the ones the Medusa
heads were trained from, :mod:`specdec_kernels.training.prompts`; never the benchmark prompts)."""

from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["build_from_files", "generate_corpus", "read_corpus"]

#: JSONL fields read as a document's text, the first present wins.
TEXT_FIELDS = ("text", "answer", "output", "response", "content")


def read_corpus(paths) -> list:
    """The documents of text and JSONL files, and of self-distillation caches.

    A ``.jsonl`` file holds one JSON object per line, its text in the first of
    :data:`TEXT_FIELDS` present (a plain JSON string also works); a folder that is a
    self-distillation cache (:mod:`~specdec_kernels.training.selfdistill`) gives its greedy
    answers, one document each; any other file is text, one document per
    blank-line-separated paragraph block.

    Parameters
    ----------
    paths : sequence of str or Path

    Returns
    -------
    list of str
        Non-empty documents.

    Raises
    ------
    ValueError
        No path given, the files hold no text, or a folder is no cache.
    FileNotFoundError
        A path that does not exist.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("corpus: give at least one text or JSONL file")
    from specdec_kernels.training.selfdistill import greedy_answers, is_feature_cache

    documents = []
    for path in paths:
        if path.is_dir():
            if not is_feature_cache(path):
                raise ValueError(f"corpus: {path} is a folder but no self-distillation cache "
                                 "(its manifest.json names no capture points)")
            documents.extend(greedy_answers(path))
            continue
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    documents.append(_jsonl_text(json.loads(line), path, number))
        else:
            documents.extend(block.strip() for block in text.split("\n\n"))
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise ValueError(f"corpus: {', '.join(map(str, paths))} hold no text (empty corpus)")
    return documents


def _jsonl_text(row, path: Path, number: int) -> str:
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        for name in TEXT_FIELDS:
            if isinstance(row.get(name), str):
                return row[name]
    raise ValueError(
        f"corpus: {path}:{number} has none of the fields {', '.join(TEXT_FIELDS)}"
    )


def build_from_files(paths, tokenizer, out, *, info: dict | None = None) -> dict:
    """Tokenize the documents of ``paths`` (no special tokens) and write a datastore.

    Returns
    -------
    dict
        The datastore's metadata.
    """
    from specdec_kernels.retrieval.datastore import build_datastore, tokenizer_fingerprint

    documents = read_corpus(paths)
    start = time.perf_counter()
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    meta = build_datastore(
        ids, out, fingerprint=tokenizer_fingerprint(tokenizer),
        info={"corpus": [str(p) for p in paths],
              "tokenize_seconds": round(time.perf_counter() - start, 3), **(info or {})},
    )
    return meta


def generate_corpus(
    loaded,
    out,
    *,
    num_prompts: int,
    max_new_tokens: int,
    batch_size: int = 8,
    seed: int = 7,
    log=print,
) -> dict:
    """Write ``out`` (JSONL: ``prompt``, ``text``), the target's greedy answers to
    ``num_prompts`` requests from :func:`specdec_kernels.training.prompts.first_stage_prompts`.

    Returns
    -------
    dict
        ``prompts``, ``tokens`` (new tokens), ``seconds``.
    """
    from specdec_kernels.decoding import generate
    from specdec_kernels.training.prompts import first_stage_prompts

    if num_prompts < 1 or max_new_tokens < 1 or batch_size < 1:
        raise ValueError("num_prompts, max_new_tokens and batch_size must be >= 1")
    prompts = first_stage_prompts(num_prompts, seed=seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start, tokens = time.perf_counter(), 0
    with out.open("w", encoding="utf-8") as f:
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i : i + batch_size]
            result = generate(loaded, batch, drafter="prompt-lookup",
                              max_new_tokens=max_new_tokens)
            for prompt, text, new in zip(batch, result.text, result.tokens):
                f.write(json.dumps({"prompt": prompt, "text": text}) + "\n")
                tokens += len(new)
            log(f"{min(i + batch_size, len(prompts))}/{len(prompts)} prompts, {tokens} tokens, "
                f"{time.perf_counter() - start:.0f} s")
    return {"prompts": len(prompts), "tokens": tokens,
            "seconds": round(time.perf_counter() - start, 1)}
