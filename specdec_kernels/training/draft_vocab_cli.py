"""``specdec draft-vocab``: rank a tokenizer's tokens by their frequency in a corpus, for the
``draft_vocab`` option of the draft-model and quantized-self drafters
(:mod:`specdec_kernels.decoding.draft_vocabulary`). A corpus of the target's own answers comes
from ``specdec datastore corpus``; text of the user's own workload ranks for that workload."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

__all__ = ["add_subcommand", "rank_corpus"]


def add_subcommand(subparsers) -> None:
    """Register ``draft-vocab`` with ``specdec``."""
    p = subparsers.add_parser(
        "draft-vocab", help="rank tokens by frequency in a corpus (for --draft-vocab)",
        description=__doc__,
    )
    p.add_argument("corpus", nargs="+", help="text files (blank-line separated documents) or "
                   "JSONL files (a 'text' field per line)")
    p.add_argument("--model", default="default", help="whose tokenizer: 'default', an HF folder "
                   "or a .gguf file")
    p.add_argument("--out", required=True, help="ranking file (JSON) to write")
    p.set_defaults(func=_run)


def rank_corpus(documents: list, tokenizer, vocab_size: int, info: dict | None = None) -> dict:
    """The ranking of ``documents`` (strings) tokenized without special tokens
    (:func:`~specdec_kernels.decoding.draft_vocabulary.count_ranking`)."""
    from specdec_kernels.decoding.draft_vocabulary import count_ranking

    lists = (tokenizer(doc, add_special_tokens=False)["input_ids"] for doc in documents)
    return count_ranking(lists, tokenizer, vocab_size,
                         {"documents": len(documents), **(info or {})})


def _run(args) -> int:
    from specdec_kernels.training.retrieval_corpus import read_corpus

    documents = read_corpus(args.corpus)  # an empty or missing corpus fails before the model loads
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.models import load_model

    start = time.perf_counter()
    loaded = load_model(args.model)
    command = ["specdec", "draft-vocab", *args.corpus, "--out", args.out]
    if args.model != "default":
        command += ["--model", args.model]
    ranking = rank_corpus(documents, loaded.tokenizer, ModelRunner(loaded.model).vocab_size,
                          {"command": " ".join(shlex.quote(w) for w in command)})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ranking, separators=(",", ":")) + "\n")
    print(f"wrote {out}: {len(ranking['ranked'])} distinct tokens of {ranking['tokens_counted']} "
          f"in {len(documents)} documents, {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
