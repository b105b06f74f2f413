"""The ``specdec`` command: a dispatcher of subcommands.

``specdec generate`` is defined here. Other modules add subcommands by exposing
``add_subcommand(subparsers)`` and being listed in :data:`SUBCOMMAND_MODULES` (imported
lazily; a module that is absent is skipped).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

__all__ = ["SUBCOMMAND_MODULES", "build_parser", "main"]

#: Modules whose ``add_subcommand(subparsers)`` registers more subcommands (e.g. ``bench``).
SUBCOMMAND_MODULES = ["specdec_kernels.bench"]


def _add_generate(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description="Generate from a causal LM (the bundled SmolLM2-135M-Instruct by default) "
        "with a drafter, and print the text and the speed/acceptance statistics.",
    )
    p.add_argument("prompt", nargs="*", help="prompts (user turns, in the chat template)")
    p.add_argument("--prompts-file", help="a .txt file (one prompt a line) or .jsonl (first turn)")
    p.add_argument("--model", default="default", help="'default', an HF folder or a .gguf file")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--drafter",
        default="prompt-lookup",
        choices=["none", "prompt-lookup", "self-speculative", "draft-model"],
    )
    p.add_argument("--draft-model", help="HF folder or .gguf file, for --drafter draft-model")
    g = p.add_argument_group("chain drafters (self-speculative, draft-model)")
    g.add_argument("--num-draft", type=int, help="drafts per step K (the start value if adaptive)")
    g.add_argument("--adaptive", action="store_true", help="grow/shrink K with acceptance")
    g.add_argument("--max-draft", type=int, help="upper bound of an adaptive K")
    g.add_argument(
        "--confidence-threshold", type=float, help="stop drafting below this probability"
    )
    g.add_argument("--layers", type=int, help="self-speculative: layers used by the draft")
    g = p.add_argument_group("prompt lookup")
    g.add_argument("--max-ngram", type=int)
    g.add_argument("--min-ngram", type=int)
    g.add_argument("--max-depth", type=int)
    g.add_argument("--max-branches", type=int)
    g.add_argument("--max-nodes", type=int)
    g = p.add_argument_group("sampling and stopping")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    g.add_argument("--no-chat-template", action="store_true", help="encode prompts as plain text")
    p.add_argument(
        "--fast-cpu-linear", action="store_true", help="small-batch CPU linears as W @ x^T"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats)")
    p.set_defaults(func=_run_generate)


def _drafter_options(args) -> dict:
    names = {
        "self-speculative": ["num_draft", "adaptive", "max_draft", "confidence_threshold"],
        "draft-model": ["num_draft", "adaptive", "max_draft", "confidence_threshold"],
        "prompt-lookup": ["max_ngram", "min_ngram", "max_depth", "max_branches", "max_nodes"],
    }.get(args.drafter, [])
    options = {}
    for name in names:
        value = getattr(args, name)
        if value is not None and value is not False:
            options[name] = value
    if args.drafter == "self-speculative" and args.layers is not None:
        options["num_layers"] = args.layers
    return options


def _read_prompts(args) -> list:
    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            if args.prompts_file.endswith(".jsonl"):
                prompts += [json.loads(line)["turns"][0] for line in f if line.strip()]
            else:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise SystemExit("specdec generate: give at least one prompt (or --prompts-file)")
    return prompts


def _run_generate(args) -> int:
    from specdec_kernels.decoding import generate, make_drafter
    from specdec_kernels.models import load_model

    prompts = _read_prompts(args)
    target = load_model(args.model, dtype=args.dtype, device=args.device)
    draft = None
    if args.drafter == "draft-model":
        if not args.draft_model:
            raise SystemExit("specdec generate: --drafter draft-model needs --draft-model PATH")
        draft = load_model(args.draft_model, dtype=args.dtype, device=args.device)
    elif args.draft_model:
        raise SystemExit("specdec generate: --draft-model is only used with --drafter draft-model")
    drafter = make_drafter(
        args.drafter,
        draft_model=draft.model if draft else None,
        draft_tokenizer=draft.tokenizer if draft else None,
        **_drafter_options(args),
    )
    out = generate(
        target,
        prompts,
        drafter=drafter,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        stop_strings=args.stop,
        chat_template=not args.no_chat_template,
        fast_cpu_linear=args.fast_cpu_linear,
    )
    if args.json:
        json.dump(
            {
                "prompts": prompts,
                "text": out.text,
                "tokens": out.tokens,
                "finish_reasons": out.finish_reasons,
                "stats": out.stats.to_dict(),
            },
            sys.stdout,
        )
        print()
    else:
        for i, text in enumerate(out.text):
            if len(prompts) > 1:
                print(f"--- [{i}] {prompts[i][:60]!r}")
            print(text)
        print(out.stats.summary(), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``specdec`` parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding kernels.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate(subparsers)
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        add = getattr(module, "add_subcommand", None)
        if add is not None:
            add(subparsers)
    return parser


def main(argv: list | None = None) -> int:
    """Entry point of ``specdec``."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
