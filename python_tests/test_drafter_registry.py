"""The drafter registry (``specdec_kernels.drafters``, issue 22 phase B): a drafter registered in
this file alone (its class, its options dataclass, one ``register`` call) is made by name,
decodes losslessly, gets its ``specdec generate`` / ``specdec bench`` flags with their range
checks, its bench method, and merges as a prophet; the built-in entries agree with their
classes' constructors; bad registrations are refused. Tiny models, seconds."""

import inspect
from dataclasses import dataclass

import pytest
import torch

from python_tests.decoding_helpers import tiny_model
from specdec_kernels import cli, drafters
from specdec_kernels.bench import cli as bench_cli
from specdec_kernels.bench.methods import METHOD_DESCRIPTIONS, Sampling, build_methods
from specdec_kernels.decoding import ChainProposal, Drafter, generate, make_drafter
from specdec_kernels.decoding.factory import drafter_class
from specdec_kernels.drafters import DRAFTER_NAMES, DrafterSpec, integer


class RepeatDrafter(Drafter):
    """Drafts the pending token ``copies`` times (right on runs of a repeated token)."""

    name = "repeat-last"

    def __init__(self, *, copies: int = 2):
        self.copies = copies

    def max_block_width(self) -> int:
        return self.copies + 1

    def propose(self, state):
        depths = [min(self.copies, max(left - 1, 0)) for left in state.remaining]
        tokens = state.pending[:, None].expand(-1, self.copies).contiguous()
        num_draft = torch.tensor(depths, dtype=torch.int64, device=tokens.device)
        return ChainProposal(tokens, num_draft, depths)

    def describe(self) -> dict:
        return {"name": self.name, "copies": self.copies}


@dataclass
class RepeatOptions:
    copies: int = integer(2, "how many times the pending token is drafted")


@pytest.fixture
def repeat_last():
    entry = drafters.register(DrafterSpec(
        "repeat-last", RepeatOptions, f"{__name__}:RepeatDrafter",
        "the pending token, drafted again"))
    yield entry
    drafters.unregister("repeat-last")


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=32, layers=2, seed=3)


PROMPTS = [[1, 2, 3, 3, 3, 3], [5, 6, 7]]


def test_made_by_name_and_lossless(repeat_last, model):
    assert "repeat-last" in DRAFTER_NAMES
    drafter = make_drafter("repeat-last", copies=3)
    assert isinstance(drafter, RepeatDrafter) and drafter.copies == 3
    plain = generate(model, PROMPTS, max_new_tokens=12)
    out = generate(model, PROMPTS, drafter="repeat-last", max_new_tokens=12)
    assert out.tokens == plain.tokens
    assert out.stats.method == "repeat-last"
    with pytest.raises(TypeError, match="window"):
        make_drafter("repeat-last", window=3)


def test_on_the_generate_command_line(repeat_last, capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["generate", "x", "--drafter", "repeat-last", "--copies", "3"])
    assert cli.drafter_options(args, "repeat-last") == {"copies": 3}
    assert "--copies" in parser._subparsers._group_actions[0].choices["generate"].format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "x", "--drafter", "repeat-last", "--copies", "0"])
    assert "argument --copies: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "x", "--copies", "3"])
    assert exit_.value.code == 2
    assert "--copies does not apply to --drafter prompt-lookup" in capsys.readouterr().err


def test_a_bench_method(repeat_last, model):
    assert METHOD_DESCRIPTIONS["ours-repeat-last"] == "ours, the pending token, drafted again"
    assert "ours-repeat-last" in bench_cli.default_methods()
    args = bench_cli.build_parser().parse_args(["--methods", "ours-repeat-last", "--copies", "4"])
    options = bench_cli._drafter_options(args, ["ours-repeat-last"])
    assert options == {"repeat-last": {"copies": 4}}
    methods = build_methods(["ours-autoregressive", "ours-repeat-last"], model, None,
                            drafter_options=options)
    assert methods["ours-repeat-last"].make_drafter().copies == 4
    runs = {name: m.run([PROMPTS[0]], 8, Sampling()) for name, m in methods.items()}
    assert runs["ours-repeat-last"].tokens == runs["ours-autoregressive"].tokens
    assert methods["ours-repeat-last"].settings == {"name": "repeat-last", "copies": 4}


def test_a_prophet(repeat_last, model):
    merged = make_drafter("multi", prophets="repeat-last,prompt-lookup")
    assert [d.name for d in merged.drafters] == ["repeat-last", "prompt-lookup"]
    plain = generate(model, PROMPTS, max_new_tokens=10)
    assert generate(model, PROMPTS, drafter=merged, max_new_tokens=10).tokens == plain.tokens


def test_a_default_prophet_by_its_place():
    drafters.register(DrafterSpec("repeat-first", RepeatOptions, f"{__name__}:RepeatDrafter",
                                  "first of the merged", default_prophet=0))
    try:
        assert drafters.default_prophets()[0] == "repeat-first"
        assert drafters.spec("multi").options().prophets[0] == "repeat-first"
    finally:
        drafters.unregister("repeat-first")
    assert drafters.default_prophets() == (
        "prompt-lookup", "suffix", "token-recycling", "retrieval", "medusa")


def test_bad_registrations_are_refused():
    with pytest.raises(ValueError, match="'jacobi' is registered already"):
        drafters.register(DrafterSpec("jacobi", RepeatOptions, None, "again"))

    @dataclass
    class Clashing:
        max_nodes: int = integer(8, "nodes", low=0)  # prompt lookup's --max-nodes is >= 1

    with pytest.raises(ValueError, match="max_nodes differs from prompt-lookup's"):
        drafters.register(DrafterSpec("clash", Clashing, None, "clashes"))
    assert "clash" not in DRAFTER_NAMES


def _constructor_defaults(cls) -> dict:
    """Keyword defaults of ``cls``, through the ``**kwargs`` it hands to its bases."""
    out = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters
        for name, p in params.items():
            if p.default is not inspect.Parameter.empty:
                out.setdefault(name, p.default)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return out


@pytest.mark.parametrize("name", [n for n in DRAFTER_NAMES if n != "none"])
def test_the_options_are_the_constructors(name):
    cls = drafter_class(name)
    defaults = _constructor_defaults(cls)
    options = drafters.option_fields(drafters.spec(name).options)
    overrides = "from_options" in vars(cls)  # it maps the options itself
    for option, field in options.items():
        if option in defaults:
            assert field.default == defaults[option], f"{name}: {option}'s default"
        else:
            assert overrides, f"{name}: {option} is no keyword of {cls.__name__}"
    if not overrides:  # its keywords are exactly the options
        own = inspect.signature(cls.__init__).parameters
        keywords = {n for n, p in own.items() if n != "self" and p.kind not in (
            inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
        assert keywords <= set(options), f"{name}: {keywords - set(options)} have no option"


def test_every_flag_names_its_option_and_range():
    parser = bench_cli.build_parser()
    flags = {a.dest: a for a in parser._actions}
    assert flags["num_draft"].option_strings == ["--num-draft"]
    assert "heads" not in flags and "num_layers" not in flags  # the bench sets them itself
    generate = cli.build_parser()._subparsers._group_actions[0].choices["generate"]
    dests = {a.dest: a for a in generate._actions}
    assert dests["num_layers"].option_strings == ["--layers"]
    assert dests["prompt_ngrams"].option_strings == ["--no-prompt-ngrams"]
    assert generate.parse_args(["x", "--no-prompt-ngrams"]).prompt_ngrams is False
    assert generate.parse_args(["x"]).prompt_ngrams is None  # not given: the drafter's default
