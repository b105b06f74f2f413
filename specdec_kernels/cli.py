"""The ``specdec`` command: a dispatcher of subcommands.

``specdec generate`` is defined here. Other modules add subcommands by exposing
``add_subcommand(subparsers)`` and being listed in :data:`SUBCOMMAND_MODULES` (imported
lazily; a module that is absent is skipped).

Every check that needs no model comes before any model loads: value ranges as the arguments
are parsed (argparse ``type`` functions: :func:`at_least`, :func:`in_interval`), then the prompt
files, then the drafter is made (its size limits, heads and datastore files). A user error (a
bad value, a missing or damaged file) is printed as ``specdec: error: <message>`` with exit
status 2, like argparse's own; ``--debug`` shows its traceback. Unexpected exceptions keep
their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

__all__ = [
    "DRAFTER_OPTIONS",
    "SUBCOMMAND_MODULES",
    "USER_ERRORS",
    "add_method_arguments",
    "add_prompts_file_argument",
    "add_sampling_arguments",
    "at_least",
    "in_interval",
    "build_parser",
    "drafter_options",
    "given_drafter_options",
    "main",
    "run_command",
]

#: Modules whose ``add_subcommand(subparsers)`` registers more subcommands (e.g. ``bench``).
SUBCOMMAND_MODULES = [
    "specdec_kernels.bench", "specdec_kernels.hf", "specdec_kernels.medusa.train",
    "specdec_kernels.retrieval.cli",
]

#: Exceptions that report a user's mistake (bad argument values, missing files): printed as
#: ``<prog>: error: <message>``, exit status 2, traceback only with ``--debug``.
USER_ERRORS = (ValueError, FileNotFoundError)

#: Command-line drafter options (argparse ``dest`` names), by the drafter they configure.
DRAFTER_OPTIONS = {
    "self-speculative": ("num_draft", "adaptive", "max_draft", "confidence_threshold"),
    "draft-model": ("num_draft", "adaptive", "max_draft", "confidence_threshold"),
    "prompt-lookup": ("max_ngram", "min_ngram", "max_depth", "max_branches", "max_nodes"),
    "lookahead": ("window", "ngram", "max_candidates"),
    "jacobi": ("num_guesses",),
    "medusa": ("heads", "cost_curve", "max_nodes", "acceptance", "posterior_threshold",
               "posterior_alpha"),
    "blockwise": ("heads", "cost_curve", "num_draft"),
    "retrieval": ("datastore", "max_depth", "max_nodes", "max_suffix", "min_suffix",
                  "max_matches", "cost_curve"),
    "quantized-self": ("num_draft", "adaptive", "max_draft", "confidence_threshold", "bits",
                       "group", "gguf"),
    "token-recycling": ("successors", "max_nodes", "max_depth", "cost_curve"),
    "suffix": ("max_depth", "depth_per_match", "min_match", "max_nodes", "max_branches",
               "cost_curve"),
    "multi": ("prophets", "datastore", "heads", "cost_curve", "max_nodes"),
    "eagle": ("eagle_draft", "branching", "max_depth", "max_nodes", "cost_curve"),
}


def at_least(low: int):
    """An argparse ``type``: an integer ``>= low`` (checked as the arguments are parsed, so
    before anything loads)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def in_interval(low: float, high: float, *, open_low: bool = False, open_high: bool = False):
    """An argparse ``type``: a number in the interval from ``low`` to ``high`` (each end
    closed unless ``open_*``; ``high`` may be ``inf``)."""
    interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        below = value <= low if open_low else value < low
        above = value >= high if open_high else value > high
        if below or above or value != value:  # NaN is in no interval
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value

    return parse


def add_sampling_arguments(group) -> None:
    """``--temperature``, ``--top-k``, ``--top-p`` (shared by ``generate`` and ``bench``),
    each checked as it is parsed."""
    group.add_argument("--temperature", type=in_interval(0, float("inf"), open_high=True),
                       default=0.0, help="0 is greedy (default)")
    group.add_argument("--top-k", type=at_least(0), default=0, help="0: no top-k filter")
    group.add_argument("--top-p", type=in_interval(0, 1, open_low=True), default=1.0)


def add_prompts_file_argument(parser, help: str) -> None:
    """``--prompts-file`` (``--prompt-file`` is the same option): one name for every command
    that reads prompts from a file (:func:`specdec_kernels.data.prompt_texts`)."""
    parser.add_argument("--prompts-file", "--prompt-file", dest="prompts_file", help=help)


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """The drafter options (see :data:`DRAFTER_OPTIONS`) and ``--torch-kernels``, shared by
    ``specdec generate`` and ``specdec bench``. Their lower limits are checked as they are
    parsed; upper limits belong to each drafter (checked when it is made, before the
    target loads)."""
    positive = at_least(1)
    g = parser.add_argument_group("chain drafters (self-speculative, draft-model, quantized-self)")
    g.add_argument("--num-draft", type=positive,
                   help="drafts per step K (the start value if adaptive)")
    g.add_argument("--adaptive", action="store_true", help="grow/shrink K with acceptance")
    g.add_argument("--max-draft", type=positive, help="upper bound of an adaptive K")
    g.add_argument("--confidence-threshold", type=in_interval(0, 1, open_high=True),
                   help="stop drafting below this probability")
    g.add_argument("--bits", type=int, choices=[4, 8], help="quantized-self: weight bits (default 4)")
    g.add_argument("--group", type=positive,
                   help="quantized-self: values per scale along K (default 32)")
    g.add_argument("--gguf", help="quantized-self: draft with this GGUF file's own weights")
    g = parser.add_argument_group("prompt lookup")
    g.add_argument("--max-ngram", type=positive)
    g.add_argument("--min-ngram", type=positive)
    g.add_argument("--max-depth", type=positive)
    g.add_argument("--max-branches", type=positive)
    g.add_argument("--max-nodes", type=positive)
    g = parser.add_argument_group("lookahead and Jacobi")
    g.add_argument("--window", type=positive, help="lookahead: window columns W")
    g.add_argument("--ngram", type=at_least(2),
                   help="lookahead: n-gram size N (N - 1 window levels)")
    g.add_argument("--max-candidates", type=at_least(0),
                   help="lookahead: pool n-grams per key G (all verified)")
    g.add_argument("--num-guesses", type=positive, help="jacobi: tokens guessed per step K")
    g = parser.add_argument_group("retrieval and merged prophets (multi)")
    g.add_argument("--datastore", help="retrieval datastore folder (`specdec datastore build`); "
                   "default: the one shipped for the default model")
    g.add_argument("--max-suffix", type=positive,
                   help="retrieval: longest context suffix looked up")
    g.add_argument("--min-suffix", type=positive,
                   help="retrieval: no drafts below this match length")
    g.add_argument("--max-matches", type=positive, help="retrieval: occurrences read per lookup")
    g.add_argument("--prophets", help="multi: comma list of drafters to merge "
                   "(default prompt-lookup,suffix,token-recycling,retrieval,medusa)")
    g = parser.add_argument_group("token recycling and suffix (--max-nodes, --max-depth too)")
    g.add_argument("--successors", type=positive,
                   help="token-recycling: top-k successors kept per vocabulary token (8)")
    g.add_argument("--min-match", type=positive,
                   help="suffix: no drafts from earlier matches shorter than this (1)")
    g.add_argument("--depth-per-match", type=in_interval(0, float("inf"), open_low=True,
                                                          open_high=True),
                   help="suffix: a match of m tokens drafts at most this times m deep (3.0)")
    g = parser.add_argument_group("eagle (EAGLE-3 draft on the target's features)")
    g.add_argument("--eagle-draft", help="EAGLE-3 folder (ours or the published layout); "
                   "default: the one shipped for the default model")
    g.add_argument("--branching", type=positive, help="eagle: nodes expanded per depth and "
                   "children per expanded node (--max-depth, --max-nodes bound the tree)")
    parser.add_argument(
        "--torch-kernels", action="store_true",
        help="on CPU, torch's own linear and attention kernels instead of the package's "
        "batch-invariant ones (default: the package's where they measure faster on this "
        "machine; SPECDEC_CPU_KERNELS=package|torch|auto)",
    )


def given_drafter_options(args: argparse.Namespace) -> dict:
    """The drafter options set on the command line (dest name -> value)."""
    names = {name for names in DRAFTER_OPTIONS.values() for name in names}
    given = {}
    for name in sorted(names):
        value = getattr(args, name, None)
        if value is not None and value is not False:
            given[name] = value
    return given


def drafter_options(args: argparse.Namespace, drafter: str) -> dict:
    """The options of ``drafter`` set on the command line, as constructor keyword arguments."""
    applies = DRAFTER_OPTIONS.get(drafter, ())
    return {k: v for k, v in given_drafter_options(args).items() if k in applies}


def _option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_generate(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description="Generate from a causal LM (the bundled SmolLM2-135M-Instruct by default) "
        "with a drafter, and print the text and the speed/acceptance statistics.",
    )
    p.add_argument("prompt", nargs="*", help="prompts (user turns, in the chat template)")
    add_prompts_file_argument(
        p, "a .txt file (one prompt a line) or .jsonl (Spec-Bench style: the first of each "
        "line's \"turns\")")
    p.add_argument("--model", default="default", help="'default', an HF folder or a .gguf file")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--weights", default="file", choices=["file", "float32"],
                   help="GGUF models: at the file's precision (default) or dequantized")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--drafter",
        default="prompt-lookup",
        choices=[
            "none", "prompt-lookup", "self-speculative", "draft-model", "lookahead", "jacobi",
            "medusa", "blockwise", "retrieval", "quantized-self", "token-recycling", "suffix",
            "multi", "eagle",
        ],
    )
    p.add_argument("--draft-model", help="HF folder or .gguf file, for --drafter draft-model")
    add_method_arguments(p)
    g = p.add_argument_group("self-speculative")
    g.add_argument("--layers", type=at_least(1), help="layers used by the draft")
    g.add_argument("--no-prompt-ngrams", action="store_true",
                   help="lookahead: do not seed the pool with the prompt's and output's n-grams")
    g = p.add_argument_group("medusa and blockwise (heads on the target's hidden states)")
    g.add_argument("--heads", help="heads folder (ours or FasterDecoding's); default: shipped")
    g.add_argument("--cost-curve", help="step-cost JSON (bench.cost_curve) to derive the tree")
    g.add_argument("--acceptance", choices=["lossless", "typical"], help="medusa: typical is lossy")
    g.add_argument("--posterior-threshold", type=in_interval(0, 1, open_low=True),
                   help="typical acceptance epsilon (0.09)")
    g.add_argument("--posterior-alpha", type=in_interval(0, 1, open_low=True),
                   help="typical acceptance alpha (0.3)")
    g = p.add_argument_group("sampling and stopping")
    g.add_argument("--max-new-tokens", type=at_least(1), default=128)
    add_sampling_arguments(g)
    g.add_argument("--min-p", type=in_interval(0, 1, open_high=True), default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    g.add_argument("--no-chat-template", action="store_true", help="encode prompts as plain text")
    g.add_argument(
        "--truncate-prompt",
        action="store_true",
        help="keep the last tokens of a prompt that does not fit the model's context with "
        "--max-new-tokens (by default such a prompt is an error)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats)")
    p.set_defaults(func=_run_generate)


def _generate_drafter_options(args) -> dict:
    """The drafter's constructor options; options for another drafter are an error."""
    applies = DRAFTER_OPTIONS.get(args.drafter, ())
    unused = sorted(set(given_drafter_options(args)) - set(applies))
    if args.layers is not None and args.drafter != "self-speculative":
        unused.append("layers")
    if args.no_prompt_ngrams and args.drafter != "lookahead":
        unused.append("no_prompt_ngrams")
    if unused:
        flags = ", ".join(_option_flag(n) for n in unused)
        verb = "does" if len(unused) == 1 else "do"
        raise ValueError(f"{flags} {verb} not apply to --drafter {args.drafter}")
    options = drafter_options(args, args.drafter)
    if args.layers is not None:
        options["num_layers"] = args.layers
    if args.drafter == "lookahead" and args.no_prompt_ngrams:
        options["prompt_ngrams"] = False
    return options


def _read_prompts(args) -> list:
    from specdec_kernels.data import check_prompt_texts, prompt_texts

    prompts = check_prompt_texts(args.prompt)
    if args.prompts_file:
        prompts += prompt_texts(args.prompts_file)
    if not prompts:
        raise ValueError("give at least one prompt (or --prompts-file)")
    return prompts


def prefill_progress_bar(file=None):
    """A ``prefill_progress(done, total)`` callback for :func:`specdec_kernels.generate` that
    draws a progress bar (on stderr) once a prefill runs in several chunks."""
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm import tqdm

            # mininterval=0: one update per chunk, each seconds apart; draw every one.
            bar = tqdm(
                total=total, unit="tok", desc="prefill", file=file or sys.stderr, leave=False,
                mininterval=0,
            )
        if done > bar.n:
            bar.update(done - bar.n)
        if done >= total:
            bar.close()
            bar = None

    return update


def _run_generate(args) -> int:
    # Everything checkable without a model is checked before the heavy imports below.
    if args.drafter == "draft-model" and not args.draft_model:
        raise ValueError("--drafter draft-model needs --draft-model PATH")
    if args.draft_model and args.drafter != "draft-model":
        raise ValueError("--draft-model is only used with --drafter draft-model")
    options = _generate_drafter_options(args)
    prompts = _read_prompts(args)

    from specdec_kernels.decoding import generate, make_drafter
    from specdec_kernels.models import load_model

    draft = None
    if args.draft_model:
        draft = load_model(args.draft_model, dtype=args.dtype, device=args.device,
                           weights=args.weights)
    # The drafter checks its options (sizes, files) before the target loads.
    drafter = make_drafter(
        args.drafter,
        draft_model=draft.model if draft else None,
        draft_tokenizer=draft.tokenizer if draft else None,
        **options,
    )
    target = load_model(args.model, dtype=args.dtype, device=args.device, weights=args.weights)
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
        cpu_kernels=False if args.torch_kernels else None,
        truncate_prompt=args.truncate_prompt,
        prefill_progress=prefill_progress_bar(),
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


def add_debug_argument(parser: argparse.ArgumentParser, *, subcommand: bool = False) -> None:
    """``--debug``: show the traceback of user errors too (see :func:`run_command`)."""
    parser.add_argument(
        "--debug",
        action="store_true",
        # A subcommand's flag must not reset the value given before the subcommand.
        default=argparse.SUPPRESS if subcommand else False,
        help="show the full traceback of every error",
    )


def run_command(parser: argparse.ArgumentParser, argv: list | None = None) -> int:
    """Parse ``argv`` and run the chosen ``func(args)``; a :data:`USER_ERRORS` exception is
    printed as ``<prog>: error: <message>`` and exits with status 2 (its traceback with
    ``--debug``).

    Raises
    ------
    SystemExit
        Status 2 on a usage or user error (as argparse does).
    """
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as error:
        if getattr(args, "debug", False):
            raise
        message = str(error)
        if isinstance(error, OSError) and error.strerror and error.filename:
            message = f"{error.strerror}: {error.filename}"  # without "[Errno 2]"
        parser.exit(2, f"{parser.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``specdec`` parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding kernels.")
    add_debug_argument(parser)
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
    for subparser in subparsers.choices.values():
        if "--debug" not in subparser._option_string_actions:
            add_debug_argument(subparser, subcommand=True)
    return parser


def main(argv: list | None = None) -> int:
    """Entry point of ``specdec`` (see :func:`run_command`)."""
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
