"""``specdec bench``: every decoding method side by side on the default model (or any
target/draft pair), by prompt category, with JSON, Markdown and PNG output."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from specdec_kernels import drafters
from specdec_kernels.bench.methods import (
    BATCH_ONE_METHODS,
    LLAMA_CPP_METHODS,
    METHOD_DESCRIPTIONS,
    METHOD_DRAFTERS,
    check_method_names,
    draft_methods,
)
from specdec_kernels.bench.prompts import load_prompts, repeated_task_prompts, select_prompts
from specdec_kernels.cli import (
    add_method_arguments,
    add_prompts_file_argument,
    add_sampling_arguments,
    at_least,
    drafter_options,
    flagged_options,
    given_drafter_options,
    option_flags,
    run_command,
)

#: Drafter options the bench sets itself, from its own flags, for every drafter that declares
#: them (so ours and the HF peers, and every heads drafter, run alike): option -> bench flag's
#: ``dest``. The cost curve goes with the heads (see ``build_methods``).
SUPPLIED_OPTIONS = {"heads": "medusa_heads", "cost_curve": "medusa_cost_curve",
                    "num_layers": "exit_layer"}


def default_methods() -> list:
    """Methods run when --methods is not given: all but those needing a draft model (added
    when --draft is given) and the llama.cpp peers."""
    return [n for n in METHOD_DESCRIPTIONS
            if n not in draft_methods() and n not in LLAMA_CPP_METHODS]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="default",
                        help="'default' (SmolLM2-135M-Instruct), an HF model folder or a .gguf file")
    parser.add_argument("--draft", help="draft model (HF folder or .gguf) for the draft-model methods")
    parser.add_argument("--methods", help="comma list from: " + ", ".join(METHOD_DESCRIPTIONS))
    positive = at_least(1)
    # One prompt per category: the default run is the README's main job.
    parser.add_argument("--prompts-per-category", type=positive, default=1,
                        help="first N prompts of each category (default 1)")
    parser.add_argument("--all-prompts", action="store_true", help="every prompt of the file")
    parser.add_argument("--categories", help="comma list of categories (default all six)")
    add_prompts_file_argument(parser, "Spec-Bench style JSONL (default: the dev set)")
    parser.add_argument("--workload", choices=["dev", "repeated-task"], default="dev",
                        help="dev: the prompt file by category (default); repeated-task: one "
                        "instruction over a series of generated inputs, run in order, "
                        "ours-suffix/ours-multi keeping a memory of earlier outputs")
    parser.add_argument("--series-length", type=at_least(2), default=16,
                        help="repeated-task: requests in the series (default 16)")
    parser.add_argument("--memory-tokens", type=positive, default=65536,
                        help="repeated-task: bound of the suffix memory (default 65536)")
    parser.add_argument("--max-new-tokens", type=positive, default=64)
    parser.add_argument("--repeats", type=positive, default=1,
                        help="runs of each method per prompt (interleaved; the figures are "
                        "medians, with the range over repeats)")
    parser.add_argument("--batch-size", type=positive, default=1,
                        help="prompts of a category decoded together (HF assisted: 1 only)")
    add_sampling_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--medusa-heads",
                        help="heads folder for ours-medusa/ours-blockwise (default: shipped)")
    parser.add_argument("--medusa-cost-curve",
                        help="step-cost JSON the medusa/blockwise trees are derived from "
                             "(default: this machine's, measured on first use)")
    parser.add_argument("--exit-layer", type=positive,
                        help="layers the self-speculative drafts use (ours and HF alike)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    # float32 by default: at file precision HF generate and our loop round attention
    # differently and the activations' int8 quantization turns that into different greedy
    # tokens within a few dozen (bench/RESULTS.md, 2026-11-25), so "identical" would say little.
    parser.add_argument("--weights", default="float32", choices=["file", "float32"],
                        help="GGUF models: dequantized to float32 (default, comparable with "
                             "HF generate token for token) or at the file's precision")
    parser.add_argument("--threads", type=positive, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default="bench_results", help="output folder")
    # Our drafters' options, as `specdec generate` has them (the HF peers keep their own).
    add_method_arguments(parser, supplied=SUPPLIED_OPTIONS)


def _drafter_options(args: argparse.Namespace, names: list) -> dict:
    """Drafter options by drafter name; an option no method of the run takes is an error."""
    used = {METHOD_DRAFTERS[n] for n in names if n in METHOD_DRAFTERS}
    taken = {option for d in used for option in flagged_options(d)}
    unused = sorted(set(given_drafter_options(args)) - taken)
    if unused:
        raise ValueError(f"{option_flags(unused)}: no method of this run takes it "
                         f"({', '.join(names)})")
    return {d: drafter_options(args, d) for d in used}


def _check_drafters(options: dict) -> None:
    """Make each of our drafters once from the options (its own checks: sizes, heads and
    datastore files) before any model loads. A drafter that needs a draft model has its
    options checked when the methods are built, before anything is allocated."""
    from specdec_kernels.decoding.api import make_drafter

    for name, given in options.items():
        if not drafters.spec(name).needs_draft_model:
            make_drafter(name, **given)


def _needs_other_assets(method: str, args: argparse.Namespace) -> bool:
    """Whether ``method``'s drafter would load an asset shipped for the default model (heads,
    a datastore, an EAGLE draft) that the command line does not replace."""
    name = METHOD_DRAFTERS.get(method)
    if name is None:
        return False
    for option, field in drafters.option_fields(drafters.spec(name).options).items():
        flag = field.metadata.get("flag")
        if flag is not None and flag.shipped and not getattr(
                args, SUPPLIED_OPTIONS.get(option, option), None):
            return True
    return False


def run(args: argparse.Namespace) -> dict:
    # The options are checked before the models are loaded (the numbers' ranges already by
    # the parser).
    names = args.methods.split(",") if args.methods else default_methods()
    if args.draft and not args.methods:
        names += list(draft_methods())
    if not args.methods and args.target != "default":
        # The shipped heads and datastore are the default model's: another target needs its own.
        names = [n for n in names if not _needs_other_assets(n, args)]
    if args.batch_size > 1:
        batch_one = [n for n in names if n in BATCH_ONE_METHODS]
        if args.methods and batch_one:
            raise ValueError(f"{batch_one} run at batch size 1 only (HF assisted generation)")
        names = [n for n in names if n not in BATCH_ONE_METHODS]
    check_method_names(names, has_draft=bool(args.draft))
    options = _drafter_options(args, names)
    repeated = args.workload == "repeated-task"
    if repeated and (args.prompts_file or args.categories or args.all_prompts):
        raise ValueError("--prompts-file, --categories and --all-prompts choose dev prompts; "
                         "--workload repeated-task makes its own series")
    if not repeated and (args.series_length != 16 or args.memory_tokens != 65536):
        raise ValueError("--series-length and --memory-tokens apply to --workload "
                         "repeated-task only (the dev prompts never feed a memory)")
    if repeated:
        prompts = repeated_task_prompts(args.series_length)
    else:
        prompts = select_prompts(
            load_prompts(args.prompts_file),
            None if args.all_prompts else args.prompts_per_category,
            args.categories.split(",") if args.categories else None,
        )
    _check_drafters(options)

    import torch

    from specdec_kernels.bench.harness import group_prompts, run_benchmark
    from specdec_kernels.bench.methods import Sampling, build_methods
    from specdec_kernels.bench.machine import machine_info
    from specdec_kernels.bench.report import write_reports
    from specdec_kernels.models import encode_prompts, load_model

    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_model(args.target, dtype=args.dtype, device=args.device, weights=args.weights)
    draft = (load_model(args.draft, dtype=args.dtype, device=args.device, weights=args.weights)
             if args.draft else None)
    methods = build_methods(
        names, target.model, target.tokenizer,
        draft_model=draft.model if draft else None,
        draft_tokenizer=draft.tokenizer if draft else None,
        exit_layer=args.exit_layer, drafter_options=options,
        cpu_kernels=False if args.torch_kernels else None,
        medusa_heads=args.medusa_heads, medusa_cost_curve=args.medusa_cost_curve,
        gguf_path=_gguf_path(args.target),
        memory_tokens=args.memory_tokens if repeated else None,
    )
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    groups = len(group_prompts(prompts, args.batch_size))
    total = groups * len(methods) * args.repeats
    print(f"{len(methods)} methods x {groups} groups of <= {args.batch_size} prompts x "
          f"{args.repeats} repeat(s) "
          f"= {total} runs, {args.max_new_tokens} new tokens each", file=sys.stderr)

    from specdec_kernels.bench.progress import BenchProgress

    start = time.perf_counter()
    with BenchProgress({name: groups * args.repeats for name in methods}) as progress:
        measurements = run_benchmark(
            methods, prompts,
            lambda text: encode_prompts(target.tokenizer, [text])[0],
            max_new_tokens=args.max_new_tokens, repeats=args.repeats, sampling=sampling,
            batch_size=args.batch_size,
            order_seed=args.seed, progress=progress,
        )
    config = {
        "target": args.target,
        "workload": args.workload,
        "draft": args.draft,
        "device": args.device,
        "target_layers": target.model.config.num_hidden_layers,
        "dtype": args.dtype,
        "weights": args.weights,
        **machine_info(args.device),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        "temperature": args.temperature,
        "cpu_kernels": next(
            (m.kernels for m in methods.values() if getattr(m, "kernels", None)), {}
        ),
        "methods": {name: METHOD_DESCRIPTIONS[name] for name in methods},
        "method_settings": {n: getattr(m, "settings", {}) for n, m in methods.items()},
        "date": time.strftime("%Y-%m-%d"),
        "seconds": round(time.perf_counter() - start, 1),
        "command": command_line(args),
    }
    out_dir = Path(args.out)
    figures = write_reports(measurements, config, out_dir)
    print((out_dir / "results.md").read_text())
    print(f"wrote {out_dir}/results.json, results.md, speedup.png, acceptance.png "
          f"({config['seconds']} s)", file=sys.stderr)
    return figures


#: How the benchmark was started, as its command line begins (``main`` sets the other).
INVOKED_AS = "specdec bench"


def _gguf_path(target: str):
    """The GGUF file of a target (None for an HF folder)."""
    from specdec_kernels.models import default_gguf_path

    if target == "default":
        return str(default_gguf_path())
    return target if str(target).endswith(".gguf") else None


def command_line(args: argparse.Namespace) -> str:
    """The command that was run (``specdec bench`` or ``python3 -m specdec_kernels.bench``)
    with the options that differ from their defaults."""
    parser = build_parser()
    words = getattr(args, "invoked_as", INVOKED_AS).split()
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "debug", "invoked_as"):
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        words.append(action.option_strings[0])
        if action.nargs != 0:
            words.append(shlex.quote(str(value)))
    return " ".join(words)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``specdec bench`` options, on ``parser`` or on a new parser."""
    parser = parser or argparse.ArgumentParser(prog="specdec bench", description=__doc__)
    add_arguments(parser)
    return parser


def add_subcommand(subparsers) -> None:
    """Register ``bench`` with the ``specdec`` command."""
    parser = subparsers.add_parser(
        "bench", help="every decoding method side by side", description=__doc__
    )
    build_parser(parser)
    parser.set_defaults(func=_run_subcommand)


def _run_subcommand(args: argparse.Namespace) -> int:
    run(args)
    return 0


def main(argv=None) -> int:
    """``python -m specdec_kernels.bench``: the same as ``specdec bench``."""
    parser = build_parser()
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of every error"
    )
    parser.set_defaults(func=_run_subcommand, invoked_as="python3 -m specdec_kernels.bench")
    return run_command(parser, argv)
