"""The drafter registry: every drafter's name, options and class, in one list.

A drafter is one :class:`DrafterSpec` in :func:`specs`: its name (``generate(drafter=...)``,
``specdec generate --drafter``, ``specdec bench``'s ``ours-<name>``), an options dataclass
whose fields carry their defaults, the help the command line shows and the range it checks as
the arguments are parsed (:func:`integer`, :func:`number`, ...), and the drafter class, named
by its import path: :func:`specdec_kernels.decoding.make_drafter` imports it only when a
drafter is made and calls its ``from_options(options, context)``.

Everything that lists drafters is generated from here: ``make_drafter``, the ``--drafter``
choices and the option flags (:func:`specdec_kernels.cli.add_method_arguments`), the bench's
``ours-<name>`` methods and their descriptions, the names ``hf.generate`` accepts and the
prophets the ``multi`` drafter merges by default (:func:`default_prophets`). A new drafter is
one file under ``decoding/`` and one :func:`register` entry at the end of this module.

This module imports nothing heavy: the command line builds its parser from it before torch or
transformers load.

Ranges: the lower limits (and the intervals of real numbers) are checked as the command line
is parsed; the upper limits of sizes belong to the drafter (they follow from the engine's
block limits and the drafter's assets) and are checked when it is made, before a model loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DRAFTER_NAMES",
    "DrafterSpec",
    "Flag",
    "api_only",
    "choice",
    "default_prophets",
    "drafter_names",
    "flag_of",
    "integer",
    "number",
    "option_fields",
    "option_values",
    "register",
    "spec",
    "specs",
    "switch",
    "text",
    "unregister",
]


# ---------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Flag:
    """How a drafter option appears on the command line (a field's ``metadata["flag"]``).

    Attributes
    ----------
    help : str
        What the option does (the command line adds each drafter's default).
    kind : type
        ``int``, ``float``, ``str`` or ``bool`` (a switch).
    low, high : float, optional
        The range checked as the argument is parsed: an ``int`` must be ``>= low``; a
        ``float`` must lie in the interval from ``low`` to ``high`` (closed ends unless
        ``open_low`` / ``open_high``).
    choices : tuple, optional
        The values allowed.
    name : str, optional
        The flag when it is not ``--<option-name>`` (``--no-<name>`` for a switch that is on
        by default).
    shipped : bool
        ``None`` means the asset shipped for the default model (heads, a datastore): another
        target needs its own.
    """

    help: str
    kind: type = str
    low: float | None = None
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    choices: tuple | None = None
    name: str | None = None
    shipped: bool = False


def integer(default, help: str, *, low: int = 1, name: str | None = None):
    """An integer option ``>= low`` (``default`` may be ``None``: the drafter decides)."""
    return field(default=default, metadata={"flag": Flag(help, int, low=low, name=name)})


def number(default, help: str, *, low: float, high: float = math.inf, open_low: bool = False,
           open_high: bool = False):
    """A real option in the interval from ``low`` to ``high``."""
    flag = Flag(help, float, low=low, high=high, open_low=open_low, open_high=open_high)
    return field(default=default, metadata={"flag": flag})


def switch(default: bool, help: str):
    """An on/off option (``--name`` turns it on; ``--no-name`` turns off one that is on by
    default)."""
    return field(default=default, metadata={"flag": Flag(help, bool)})


def text(default, help: str, *, shipped: bool = False):
    """A string option (a path, mostly; the Python API also takes the loaded object)."""
    return field(default=default, metadata={"flag": Flag(help, str, shipped=shipped)})


def choice(default, help: str, choices: tuple):
    """One of ``choices``."""
    flag = Flag(help, type(choices[0]), choices=tuple(choices))
    return field(default=default, metadata={"flag": flag})


def api_only(default=None):
    """An option of the Python API only (an object, or a setting the command line leaves at
    its default)."""
    return field(default=default)


def option_fields(options) -> dict:
    """``{name: dataclasses.Field}`` of an options dataclass (or its instance), in order."""
    return {f.name: f for f in dataclasses.fields(options)}


def option_values(options) -> dict:
    """An options instance as constructor keyword arguments (objects kept, not copied)."""
    return {name: getattr(options, name) for name in option_fields(options)}


def flag_of(option: dataclasses.Field) -> str | None:
    """The command-line flag of an option field (``None``: Python API only)."""
    flag = option.metadata.get("flag")
    if flag is None:
        return None
    if flag.name:
        return flag.name
    on_by_default = flag.kind is bool and option.default is True
    return ("--no-" if on_by_default else "--") + option.name.replace("_", "-")


# ---------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter of the registry.

    Attributes
    ----------
    name : str
        Its name everywhere (``generate(drafter=name)``, ``--drafter name``, ``ours-name``).
    options : type
        A dataclass of its options (see :func:`integer` and the others); ``make_drafter(name,
        **options)`` fills it.
    drafter : str or None
        ``"module:Class"`` of the :class:`~specdec_kernels.decoding.Drafter` subclass,
        imported when a drafter is made; ``None`` for plain decoding.
    description : str
        One line: what it drafts with (the bench's method description, ``--help``).
    needs_draft_model : bool
        It drafts with a second model (``draft_model=``, ``--draft-model``, ``--draft``).
    passes_draft_model : bool
        It hands ``draft_model`` on to the drafters it merges (``multi``); any other drafter
        given a draft model is an error.
    default_prophet : int, optional
        Its place among the prophets ``multi`` merges by default (``None``: not merged
        unless named).
    method : str, optional
        The bench's method name when it is not ``ours-<name>``.
    """

    name: str
    options: type
    drafter: str | None
    description: str
    needs_draft_model: bool = False
    passes_draft_model: bool = False
    default_prophet: int | None = None
    method: str | None = None

    @property
    def method_name(self) -> str:
        return self.method or f"ours-{self.name}"


_SPECS: dict = {}


def register(entry: DrafterSpec) -> DrafterSpec:
    """Add a drafter to the registry (after the others).

    Raises
    ------
    ValueError
        A name already registered, options that are not a dataclass, or an option that
        another drafter declares with another kind, range or flag (the command line has one
        flag per option name).
    """
    if entry.name in _SPECS:
        raise ValueError(f"name: a drafter named {entry.name!r} is registered already")
    if not dataclasses.is_dataclass(entry.options):
        raise ValueError(f"options: {entry.name} needs a dataclass, got {entry.options!r}")
    for name, option in option_fields(entry.options).items():
        flag = option.metadata.get("flag")
        for other in _SPECS.values():
            theirs = option_fields(other.options).get(name)
            if theirs is None or theirs.metadata.get("flag") is None or flag is None:
                continue
            mine = dataclasses.replace(flag, help="")
            if mine != dataclasses.replace(theirs.metadata["flag"], help="") or \
                    flag_of(option) != flag_of(theirs):
                raise ValueError(
                    f"options: {entry.name}'s {name} differs from {other.name}'s in kind, "
                    "range or flag; one flag serves both"
                )
    _SPECS[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a drafter (tests register and remove their own)."""
    del _SPECS[name]


def specs() -> tuple:
    """Every registered drafter, in registration order (the order of ``--help``, of the
    bench's report and of :data:`DRAFTER_NAMES`)."""
    return tuple(_SPECS.values())


def drafter_names() -> tuple:
    """The registered drafters' names (``"none"`` first)."""
    return tuple(_SPECS)


def spec(name: str) -> DrafterSpec:
    """The registry entry of ``name``.

    Raises
    ------
    ValueError
        An unknown name (the message lists the known ones).
    """
    if name not in _SPECS:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(_SPECS)}")
    return _SPECS[name]


def default_prophets() -> tuple:
    """The drafters ``multi`` merges when no ``prophets`` are given, in their order."""
    ranked = [s for s in _SPECS.values() if s.default_prophet is not None]
    return tuple(s.name for s in sorted(ranked, key=lambda s: s.default_prophet))


class _Names(Sequence):
    """The registered names as a read-only sequence that follows :func:`register`."""

    def __getitem__(self, index):
        return drafter_names()[index]

    def __len__(self) -> int:
        return len(_SPECS)

    def __repr__(self) -> str:
        return repr(drafter_names())


#: Names accepted by ``generate(drafter=...)`` and the command line (always current).
DRAFTER_NAMES = _Names()


# ---------------------------------------------------------------------------- the drafters


def _num_draft(default):
    return integer(default, "drafts per step K (the start value if adaptive)")


def _max_nodes(default):
    return integer(default, "most drafted nodes per step (a budget may keep fewer)")


def _max_depth(default):
    return integer(default, "deepest drafted token")


def _cost_curve():
    return text(None, "step-cost JSON (bench.cost_curve) that sizes the tree "
                "(default: this machine's, measured on first use)")


def _heads():
    return text(None, "Medusa heads folder (ours or FasterDecoding's); default: shipped",
                shipped=True)


def _datastore():
    return text(None, "retrieval datastore folder (`specdec datastore build`); default: the "
                "one shipped for the default model", shipped=True)


@dataclass
class NoOptions:
    """Plain decoding takes no options."""


@dataclass
class ChainOptions:
    """Chain drafters (a second model, or the target's layers or quantized copy, drafts K
    tokens one after the other)."""

    num_draft: int = _num_draft(4)
    adaptive: bool = switch(False, "grow/shrink K with acceptance")
    min_draft: int = api_only(1)
    max_draft: int = integer(8, "upper bound of an adaptive K")
    confidence_threshold: float | None = number(
        None, "stop drafting below this probability", low=0, high=1, open_high=True)
    budget: bool = api_only(True)
    cost_curve: object = text(None, "step-cost JSON (bench.cost_curve) of the target that, "
                              "with the draft's, sizes the chain (default: this machine's)")
    draft_cost_curve: object = api_only(None)


@dataclass
class PromptLookupOptions:
    max_ngram: int = integer(4, "longest n-gram looked up in the context")
    min_ngram: int = integer(2, "shortest n-gram looked up")
    strong_ngram: int = api_only(4)
    max_depth: int = _max_depth(16)
    short_depth: int = api_only(4)
    max_branches: int = integer(2, "most continuations merged into the tree")
    max_nodes: int = _max_nodes(16)


@dataclass
class SelfSpeculativeOptions(ChainOptions):
    num_draft: int = _num_draft(1)
    num_layers: int | None = integer(
        None, "layers used by the draft (default: all but the last 2)", name="--layers")


@dataclass
class LookaheadOptions:
    window: int | None = integer(None, "window columns W (default: per device)")
    ngram: int | None = integer(None, "n-gram size N (N - 1 window levels)", low=2)
    max_candidates: int | None = integer(
        None, "pool n-grams per key G (all verified)", low=0)
    prompt_ngrams: bool = switch(
        True, "do not seed the pool with the prompt's and output's n-grams")


@dataclass
class JacobiOptions:
    num_guesses: int = integer(4, "tokens guessed per step K (at most, with the budget)")
    budget: bool = api_only(True)
    cost_curve: object = _cost_curve()


@dataclass
class MedusaOptions:
    heads: object = _heads()
    tree: object = api_only(None)
    cost_curve: object = _cost_curve()
    max_nodes: int = _max_nodes(64)
    acceptance: str = choice("lossless", "how drafts are accepted (typical is lossy)", ("lossless", "typical"))
    posterior_threshold: float = number(0.09, "typical acceptance epsilon", low=0, high=1,
                                        open_low=True)
    posterior_alpha: float = number(0.3, "typical acceptance alpha", low=0, high=1,
                                    open_low=True)


@dataclass
class BlockwiseOptions:
    heads: object = _heads()
    num_draft: int | None = _num_draft(None)
    cost_curve: object = _cost_curve()
    max_nodes: int = api_only(64)
    budget: bool = api_only(True)


@dataclass
class RetrievalOptions:
    datastore: object = _datastore()
    max_depth: int = _max_depth(8)
    max_nodes: int = _max_nodes(16)
    max_suffix: int = integer(16, "longest context suffix looked up")
    min_suffix: int = integer(2, "no drafts below this match length")
    max_matches: int = integer(64, "occurrences read per lookup")
    cost_curve: object = _cost_curve()
    budget: bool = api_only(True)


def _draft_vocab():
    return integer(None, "the draft's LM head scores only this many tokens, the most frequent "
                   "(default: all)")


def _token_ranking():
    return text(None, "ranking file of the draft vocabulary (specdec draft-vocab; default: the "
                "package's for the default model's tokenizer, else token ids in order)")


@dataclass
class QuantizedSelfOptions(ChainOptions):
    num_draft: int = _num_draft(11)
    bits: int = choice(4, "weight bits", (4, 8))
    head_bits: int = choice(4, "the LM head's weight bits", (4, 8))
    rerank: int = integer(4, "re-score the head's top N logits of each row with the target's "
                          "own rows (0: off)", low=0)
    group: int = integer(32, "values per scale along K")
    gguf: str | None = text(None, "draft with this GGUF file's own weights")
    narrow_kv: bool = switch(True, "the draft's K/V in bfloat16 (float32 drafts on the CPU kernels)")
    draft_vocab: int | None = _draft_vocab()
    token_ranking: str | None = _token_ranking()


@dataclass
class TokenRecyclingOptions:
    successors: int = integer(8, "top-k successors kept per vocabulary token")
    max_nodes: int = _max_nodes(32)
    max_depth: int = _max_depth(8)
    cost_curve: object = _cost_curve()
    budget: bool = api_only(True)


@dataclass
class SuffixOptions:
    memory: object = api_only(None)
    max_depth: int = _max_depth(16)
    depth_per_match: float = number(
        3.0, "a match of m tokens drafts at most this times m deep", low=0,
        open_low=True, open_high=True)
    min_match: int = integer(1, "no drafts from earlier matches shorter than this")
    max_nodes: int = _max_nodes(16)
    max_branches: int = integer(3, "most continuations merged into the tree")
    cost_curve: object = _cost_curve()
    budget: bool = api_only(True)


@dataclass
class MultiOptions:
    prophets: object = field(default_factory=default_prophets, metadata={"flag": Flag(
        "comma list of drafters to merge")})
    datastore: object = _datastore()
    heads: object = _heads()
    cost_curve: object = _cost_curve()
    memory: object = api_only(None)
    max_nodes: int = _max_nodes(24)


@dataclass
class EagleOptions:
    eagle_draft: object = text(None, "EAGLE-3 folder (ours or the published layout); default: "
                               "the one shipped for the default model", shipped=True)
    branching: int = integer(8, "nodes expanded per depth and children per expanded "
                             "node")
    max_depth: int = _max_depth(6)
    max_nodes: int = _max_nodes(48)
    cost_curve: object = _cost_curve()
    draft_dtype: str = choice("auto", "the draft network's weights and activations "
                              "(int8: int8 weights in groups of 32, float32 activations; auto: "
                              "int8 on the package's CPU kernels, else float32)",
                              ("auto", "float32", "bfloat16", "int8"))


@dataclass
class DraftModelOptions(ChainOptions):
    narrow_kv: bool = switch(True, "the draft's K/V in bfloat16 (float32 drafts on the CPU kernels)")
    draft_vocab: int | None = _draft_vocab()
    token_ranking: str | None = _token_ranking()


_D = "specdec_kernels.decoding."
register(DrafterSpec("none", NoOptions, None, "specdec_kernels.generate without a drafter",
                     method="ours-autoregressive"))
register(DrafterSpec("prompt-lookup", PromptLookupOptions,
                     _D + "prompt_lookup:PromptLookupDrafter",
                     "prompt lookup (n-gram matches merged into a tree)",
                     default_prophet=1))
register(DrafterSpec("self-speculative", SelfSpeculativeOptions,
                     _D + "self_speculative:SelfSpeculativeDrafter",
                     "layer-skip self-speculation (first L layers draft)"))
register(DrafterSpec("lookahead", LookaheadOptions, _D + "lookahead:LookaheadDrafter",
                     "lookahead decoding (Jacobi window + n-gram pool, one forward)"))
register(DrafterSpec("jacobi", JacobiOptions, _D + "lookahead:JacobiDrafter",
                     "plain Jacobi decoding (guesses verified as a chain)"))
register(DrafterSpec("medusa", MedusaOptions, _D + "medusa:MedusaDrafter",
                     "Medusa heads (shipped for the default model), tree of top-k "
                     "guesses", default_prophet=5))
register(DrafterSpec("blockwise", BlockwiseOptions, _D + "medusa:BlockwiseDrafter",
                     "blockwise parallel decoding (each Medusa head's top-1, a chain)"))
register(DrafterSpec("retrieval", RetrievalOptions, _D + "retrieval:RetrievalDrafter",
                     "retrieval (REST) from the shipped datastore, budgeted tree",
                     default_prophet=4))
register(DrafterSpec("quantized-self", QuantizedSelfOptions,
                     _D + "quantized:QuantizedSelfDrafter",
                     "an int4 copy of the target (quantized_linear) drafts"))
register(DrafterSpec("token-recycling", TokenRecyclingOptions,
                     _D + "token_recycling:TokenRecyclingDrafter",
                     "token recycling (the target's recent top-k per token, a tree)",
                     default_prophet=3))
register(DrafterSpec("suffix", SuffixOptions, _D + "suffix:SuffixDrafter",
                     "suffix automaton of the context (and of earlier outputs, repeated "
                     "task)", default_prophet=2))
register(DrafterSpec("multi", MultiOptions, _D + "multi:MultiDrafter",
                     "prompt lookup + suffix + token recycling + retrieval + Medusa "
                     "heads, merged into one budgeted tree", passes_draft_model=True))
register(DrafterSpec("eagle", EagleOptions, _D + "eagle:EagleDrafter",
                     "EAGLE-3 draft on the target's features (shipped), EAGLE-2 dynamic "
                     "tree"))
register(DrafterSpec("draft-model", DraftModelOptions, _D + "draft_model:DraftModelDrafter",
                     "a separate draft model", needs_draft_model=True))
