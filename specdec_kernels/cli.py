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
import dataclasses
import importlib
import json
import sys

from specdec_kernels import drafters
from specdec_kernels.drafters import DRAFTER_NAMES

__all__ = [
    "SUBCOMMAND_MODULES",
    "USER_ERRORS",
    "add_method_arguments",
    "add_prompts_file_argument",
    "add_sampling_arguments",
    "at_least",
    "in_interval",
    "build_parser",
    "drafter_options",
    "flagged_options",
    "given_drafter_options",
    "option_flags",
    "main",
    "run_command",
]

#: Modules whose ``add_subcommand(subparsers)`` registers more subcommands (e.g. ``bench``).
SUBCOMMAND_MODULES = [
    "specdec_kernels.bench", "specdec_kernels.hf", "specdec_kernels.training.medusa",
    "specdec_kernels.training.datastore_cli", "specdec_kernels.training.draft_vocab_cli",
]

#: Exceptions that report a user's mistake (bad argument values, missing files): printed as
#: ``<prog>: error: <message>``, exit status 2, traceback only with ``--debug``.
USER_ERRORS = (ValueError, FileNotFoundError)

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


def add_method_arguments(parser: argparse.ArgumentParser, *, supplied=()) -> None:
    """The drafters' option flags and ``--torch-kernels``, shared by ``specdec generate`` and
    ``specdec bench``, generated from the drafter registry (:mod:`specdec_kernels.drafters`).

    One flag per option name, whichever drafters declare it: first the options of shared
    options classes (the chain drafters'), then each drafter's own, one group per drafter in
    registry order. Lower limits are checked as they are parsed; upper limits belong to each
    drafter (checked when it is made, before the target loads). Flags not given are
    ``None``. Options named in ``supplied`` get no flag (the caller sets them itself)."""
    groups = {}  # a shared options class or a drafter -> (title, description, option names)
    for entry in drafters.specs():
        for base in reversed(entry.options.__mro__[1:]):
            if dataclasses.is_dataclass(base):
                users = [s.name for s in drafters.specs() if issubclass(s.options, base)]
                groups.setdefault(base, (f"shared by {', '.join(users)}", base.__doc__,
                                         [f.name for f in dataclasses.fields(base)]))
    for entry in drafters.specs():
        groups[entry.name] = (f"--drafter {entry.name}", entry.description,
                              list(drafters.option_fields(entry.options)))
    added = set(supplied)
    for title, description, names in groups.values():
        group = None
        for name in names:
            takers = _option_takers(name)
            if name in added or not takers:
                continue
            added.add(name)
            group = group or parser.add_argument_group(title, description)
            _add_option(group, name, takers)
    parser.add_argument(
        "--torch-kernels", action="store_true",
        help="on CPU, torch's own linear and attention kernels instead of the package's "
        "batch-invariant ones (default: the package's where they measure faster on this "
        "machine; SPECDEC_CPU_KERNELS=package|torch|auto)",
    )


def _option_takers(name: str) -> list:
    """``[(drafter spec, field)]`` of the drafters with a flag for option ``name``."""
    takers = []
    for entry in drafters.specs():
        option = drafters.option_fields(entry.options).get(name)
        if option is not None and drafters.flag_of(option) is not None:
            takers.append((entry, option))
    return takers


def _shown_default(option):
    if option.default_factory is not dataclasses.MISSING:
        value = option.default_factory()
        return ",".join(value) if isinstance(value, (tuple, list)) else value
    return None if option.default is dataclasses.MISSING else option.default


def _add_option(group, name: str, takers: list) -> None:
    """One flag for option ``name`` of every drafter in ``takers``: its kind, range and help
    (with each drafter's default) from the registry."""
    first = takers[0][1]
    flag = first.metadata["flag"]
    helps = list(dict.fromkeys(option.metadata["flag"].help for _, option in takers))
    defaults = [(entry.name, _shown_default(option)) for entry, option in takers
                if flag.kind is not bool and _shown_default(option) is not None]
    text = "; ".join(helps)
    if len(takers) > 1:
        text += f" [{', '.join(entry.name for entry, _ in takers)}]"
    if defaults and len({str(v) for _, v in defaults}) == 1 and len(defaults) == len(takers):
        text += f" (default {defaults[0][1]})"
    elif defaults:
        text += " (default " + ", ".join(f"{n} {v}" for n, v in defaults) + ")"
    kwargs = {"dest": name, "default": None, "help": text}
    if flag.kind is not bool:
        kwargs["metavar"] = drafters.flag_of(first).lstrip("-").replace("-", "_").upper()
    if flag.kind is bool:
        kwargs["action"] = "store_false" if first.default is True else "store_true"
    elif flag.choices:
        kwargs.update(type=flag.kind, choices=list(flag.choices))
    elif flag.kind is int:
        kwargs["type"] = at_least(int(flag.low))
    elif flag.kind is float:
        kwargs["type"] = in_interval(flag.low, flag.high, open_low=flag.open_low,
                                     open_high=flag.open_high)
    group.add_argument(drafters.flag_of(first), **kwargs)


def _option_flags() -> dict:
    """Option name -> its flag, over every registered drafter."""
    return {name: drafters.flag_of(option) for entry in drafters.specs()
            for name, option in drafters.option_fields(entry.options).items()
            if drafters.flag_of(option) is not None}


def flagged_options(drafter: str) -> tuple:
    """The options of ``drafter`` that have a command-line flag."""
    return tuple(name for name, option in
                 drafters.option_fields(drafters.spec(drafter).options).items()
                 if drafters.flag_of(option) is not None)


def given_drafter_options(args: argparse.Namespace) -> dict:
    """The drafter options set on the command line (option name -> value)."""
    given = {}
    for name in sorted(_option_flags()):
        value = getattr(args, name, None)
        if value is not None:
            given[name] = value
    return given


def drafter_options(args: argparse.Namespace, drafter: str) -> dict:
    """The options of ``drafter`` set on the command line, as ``make_drafter`` keywords."""
    applies = flagged_options(drafter)
    return {k: v for k, v in given_drafter_options(args).items() if k in applies}


def option_flags(names) -> str:
    """``"--a, --b"``: the flags of the options ``names``."""
    flags = _option_flags()
    return ", ".join(flags.get(n, "--" + n.replace("_", "-")) for n in names)


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
    p.add_argument("--drafter", default="prompt-lookup", choices=list(DRAFTER_NAMES))
    p.add_argument("--draft-model", help="HF folder or .gguf file, for --drafter draft-model")
    add_method_arguments(p)
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


def _add_calibrate(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure this machine's step cost for a model (sizes every drafter's trees)",
        description="Measure c(T), the cost of one forward over T tokens after a cached "
        "prefix, for the model on this machine, and keep it where the drafters read it "
        "(measured on first use otherwise; run again after changing threads, ISA or kernels).",
    )
    p.add_argument("--model", default="default", help="'default', an HF folder or a .gguf file")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--weights", default="file", choices=["file", "float32"],
                   help="GGUF models: at the file's precision (default) or dequantized")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_calibrate)


def _run_calibrate(args) -> int:
    from specdec_kernels.decoding import ModelRunner, calibration
    from specdec_kernels.models import load_model

    loaded = load_model(args.model, dtype=args.dtype, device=args.device, weights=args.weights)
    runner = ModelRunner(loaded.model)
    try:
        curve = calibration.calibrate(runner)
    finally:
        runner.release()
    curves = {prefix: dict(points) for prefix, points in curve.by_prefix}
    if args.json:
        print(json.dumps({"latency_ms_by_prefix": curves, "source": curve.source,
                          "kernels": runner.kernels.describe()}))
        return 0
    print(f"step cost of {args.model} on this machine ({runner.kernels.path} kernels, "
          f"{runner.kernels.isa}), kept in {curve.source.removeprefix('measured here (')[:-1]}:")
    for prefix, points in curves.items():
        print(f"after {prefix} cached tokens:")
        print(f"{'T':<10}" + "".join(f"{t:>8}" for t in points))
        print(f"{'ms':<10}" + "".join(f"{ms:>8.2f}" for ms in points.values()))
        print(f"{'c(T)/c(1)':<10}" + "".join(f"{ms / points[1]:>8.2f}" for ms in points.values()))
    return 0


def _generate_drafter_options(args) -> dict:
    """The drafter's options; a draft model without a drafter that takes one, or options for
    another drafter, are errors."""
    entry = drafters.spec(args.drafter)
    if entry.needs_draft_model and not args.draft_model:
        raise ValueError(f"--drafter {entry.name} needs --draft-model PATH")
    if args.draft_model and not entry.needs_draft_model:
        users = " or ".join(s.name for s in drafters.specs() if s.needs_draft_model)
        raise ValueError(f"--draft-model is only used with --drafter {users}")
    unused = sorted(set(given_drafter_options(args)) - set(flagged_options(args.drafter)))
    if unused:
        verb = "does" if len(unused) == 1 else "do"
        raise ValueError(f"{option_flags(unused)} {verb} not apply to --drafter {args.drafter}")
    return drafter_options(args, args.drafter)


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
    _add_calibrate(subparsers)
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
