"""``specdec datastore``: build a retrieval datastore from a corpus (``build``), or make a
corpus of the target's own answers (``corpus``)."""

from __future__ import annotations

import shlex
import sys
import time

__all__ = ["add_subcommand"]


def add_subcommand(subparsers) -> None:
    """Register ``datastore build`` and ``datastore corpus`` with ``specdec``."""
    parser = subparsers.add_parser(
        "datastore", help="retrieval datastores (REST) for --drafter retrieval",
        description=__doc__,
    )
    sub = parser.add_subparsers(dest="datastore_command", required=True)
    b = sub.add_parser("build", help="tokenize a corpus and write a datastore folder")
    b.add_argument("corpus", nargs="+", help="text files (blank-line separated documents), "
                   "JSONL files (a 'text' field per line) or self-distillation cache folders "
                   "(their greedy answers)")
    b.add_argument("--model", default="default", help="whose tokenizer: 'default', an HF folder "
                   "or a .gguf file")
    b.add_argument("--out", required=True, help="datastore folder to write")
    b.set_defaults(func=_run_build)
    c = sub.add_parser("corpus", help="the target's own answers to the package's generic "
                       "requests (never the benchmark prompts), as JSONL")
    c.add_argument("--model", default="default")
    c.add_argument("--out", required=True, help="JSONL file to write")
    c.add_argument("--num-prompts", type=int, default=64)
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--batch-size", type=int, default=8)
    c.add_argument("--seed", type=int, default=7)
    c.set_defaults(func=_run_corpus)


def _command(args) -> str:
    """The ``specdec datastore build`` command that made a store (from the parsed arguments,
    so it reads the same however the parser was reached)."""
    words = ["specdec", "datastore", "build", *args.corpus, "--out", args.out]
    if args.model != "default":
        words += ["--model", args.model]
    return " ".join(shlex.quote(w) for w in words)


def _run_build(args) -> int:
    from specdec_kernels.training.retrieval_corpus import build_from_files, read_corpus

    read_corpus(args.corpus)  # an empty or missing corpus fails before the model loads
    from specdec_kernels.models import load_model

    start = time.perf_counter()
    tokenizer = load_model(args.model).tokenizer
    meta = build_from_files(args.corpus, tokenizer, args.out,
                            info={"command": _command(args), "model": args.model})
    print(f"wrote {args.out}: {meta['num_tokens']} tokens of {meta['num_documents']} documents "
          f"in {meta['build_seconds']:.2f} s (suffix array), {time.perf_counter() - start:.1f} s "
          "in all", file=sys.stderr)
    return 0


def _run_corpus(args) -> int:
    from specdec_kernels.models import load_model
    from specdec_kernels.training.retrieval_corpus import generate_corpus

    loaded = load_model(args.model)
    info = generate_corpus(loaded, args.out, num_prompts=args.num_prompts,
                           max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                           seed=args.seed, log=lambda m: print(m, file=sys.stderr))
    print(f"wrote {args.out}: {info['prompts']} answers, {info['tokens']} tokens, "
          f"{info['seconds']} s", file=sys.stderr)
    return 0
