"""The decoding methods a benchmark compares: ours (plain and with each drafter) and the peers
a user would otherwise pick (Hugging Face ``generate``, plain and assisted)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from specdec_kernels import drafters

#: The reference every speedup is measured against.
BASELINE = "hf-generate"


@dataclass
class Sampling:
    """Decoding mode of a benchmark run: greedy when ``temperature == 0``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RunRecord:
    """One method on one group of prompts (a batch; one prompt at batch size 1).

    ``tokens`` holds each request's new tokens. ``forward_widths`` / ``forward_rows`` give
    the tokens per request and the requests of every full target forward, the prefill
    included, for every method alike (so plain decoding has tau = 1 exactly);
    ``proposed_at`` / ``accepted_at`` count drafted and accepted tokens per draft depth
    (ours only); ``drafter_seconds`` is the time spent drafting (ours only).
    ``first_token_from_prefill``: HF's prefill yields the first token; ours prefills all but
    the last prompt token and every new token comes from a decoding step.
    ``drafter_report``: what our drafter measured about itself (per-prophet figures of a merged
    drafter; see ``Drafter.report``).
    """

    tokens: list
    seconds: float
    forward_widths: list = field(default_factory=list)
    forward_rows: list = field(default_factory=list)
    drafter_seconds: float | None = None
    proposed_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)
    first_token_from_prefill: bool = True
    drafter_report: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


class ForwardCounter:
    """Records the width (tokens per request) and the rows (requests) of every full forward of
    a model: the engine's through :func:`~specdec_kernels.decoding.runner.observe_forwards`
    (``engine=True``; its direct forward calls no module, so a hook would see nothing), HF's
    through a public forward hook on the last decoder layer.

    Early-exit drafts never reach the last layer, so only full target forwards are recorded.
    """

    def __init__(self, model, *, engine: bool = False):
        self.widths: list = []
        self.rows: list = []
        if engine:
            from specdec_kernels.decoding.runner import observe_forwards

            self._handle = observe_forwards(model, self._observe)
        else:
            layers = model.get_decoder().layers
            self._handle = layers[-1].register_forward_hook(self._hook, with_kwargs=True)

    def _observe(self, width: int, rows: int) -> None:
        self.widths.append(width)
        self.rows.append(rows)

    def _hook(self, module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        self._observe(int(hidden.shape[-2]), int(hidden.shape[0]) if hidden.dim() == 3 else 1)

    def close(self) -> None:
        self._handle.remove()


class _HFInternalWarning(logging.Filter):
    """Drops transformers' "Passing `generation_config` together with generation-related
    arguments ... is deprecated" warning.

    Our ``generate`` call passes every setting as a keyword argument and no
    ``generation_config``; the warning comes from transformers' own assisted generation,
    whose candidate generator calls the assistant's ``generate`` with its generation config
    *and* ``min_new_tokens`` / ``max_new_tokens`` (transformers 5.x). Only that message is
    dropped, and only while an assisted peer runs.
    """

    PREFIX = "Passing `generation_config` together with generation-related"

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.PREFIX)


@contextlib.contextmanager
def _without_hf_internal_warning():
    logger = logging.getLogger("transformers.generation.utils")
    drop = _HFInternalWarning()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class HFMethod:
    """``model.generate`` with fixed extra keyword arguments (assisted generation options).

    Every generation setting goes to ``generate`` as a keyword argument (the model's own
    ``generation_config`` supplies the rest), never together with a ``generation_config``.
    """

    kind = "hf"

    def __init__(self, name: str, model, tokenizer, **generate_kwargs):
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.generate_kwargs = generate_kwargs

    def run(self, prompts: list, max_new_tokens: int, sampling: Sampling) -> RunRecord:
        """Generate for a batch of prompts (token id lists; left-padded when ragged)."""
        if len(prompts) > 1 and self.generate_kwargs:
            raise ValueError(f"{self.name}: HF assisted generation supports batch size 1 only")
        device = self.model.device
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id or 0
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        kwargs = dict(self.generate_kwargs)
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            torch.manual_seed(sampling.seed)
            kwargs.update(
                do_sample=True, temperature=sampling.temperature,
                top_k=sampling.top_k or None, top_p=sampling.top_p,
            )
        counter = ForwardCounter(self.model)
        quiet = _without_hf_internal_warning() if self.generate_kwargs else contextlib.nullcontext()
        try:
            start = time.perf_counter()
            with torch.inference_mode(), quiet:
                out = self.model.generate(
                    input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id,
                    **kwargs,
                )
            _synchronize(device)
            seconds = time.perf_counter() - start
        finally:
            counter.close()
        from specdec_kernels.decoding.api import eos_token_ids

        eos = eos_token_ids(self.model, self.tokenizer)
        tokens = [_until_eos(row, eos) for row in out[:, width:].tolist()]
        return RunRecord(
            tokens, seconds, forward_widths=counter.widths, forward_rows=counter.rows
        )


def _until_eos(tokens: list, eos: set) -> list:
    """A batch row of HF generate up to and including its first EOS (the rest is padding)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


class OursMethod:
    """:func:`specdec_kernels.generate` with one drafter (or none).

    ``memory``: a :class:`~specdec_kernels.decoding.SuffixMemory` the method's drafters share
    from run to run (the repeated-task workload), emptied by :meth:`reset`.
    """

    kind = "ours"

    def __init__(self, name: str, model, tokenizer, make_drafter, *, memory=None,
                 **generate_kwargs):
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.make_drafter = make_drafter  # a fresh drafter per run: drafters keep state
        self.memory = memory
        self.generate_kwargs = generate_kwargs
        self.settings: dict = {}
        self.kernels: dict = {}  # which kernels the last run's target forwards used

    def reset(self) -> None:
        """Forget what earlier runs left in the memory (if any)."""
        if self.memory is not None:
            self.memory.clear()

    def run(self, prompts: list, max_new_tokens: int, sampling: Sampling) -> RunRecord:
        """Generate for a batch of prompts (token id lists)."""
        from specdec_kernels.decoding import generate

        counter = ForwardCounter(self.model, engine=True)
        try:
            start = time.perf_counter()
            out = generate(
                self.model,
                prompts,
                drafter=self.make_drafter(),
                tokenizer=self.tokenizer,
                max_new_tokens=max_new_tokens,
                temperature=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                seed=sampling.seed,
                chat_template=False,
                **self.generate_kwargs,
            )
            _synchronize(self.model.device)
            seconds = time.perf_counter() - start
        finally:
            counter.close()
        stats = out.stats
        self.settings = dict(stats.drafter)
        self.kernels = dict(stats.kernels)
        return RunRecord(
            out.tokens,
            seconds,
            forward_widths=counter.widths,
            forward_rows=counter.rows,
            drafter_seconds=stats.drafter_seconds,
            proposed_at=list(stats.proposed_at),
            accepted_at=list(stats.accepted_at),
            first_token_from_prefill=False,
            drafter_report=dict(stats.drafter_report),
        )


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


#: HF assisted generation refuses batches of more than one prompt; llama-cpp-python decodes one
#: prompt at a time.
BATCH_ONE_METHODS = ("hf-prompt-lookup", "hf-early-exit", "hf-assisted", "llama-cpp",
                     "llama-cpp-prompt-lookup")

#: The llama.cpp peers (optional: llama-cpp-python, see ``specdec_kernels.bench.llama_cpp``).
LLAMA_CPP_METHODS = ("llama-cpp", "llama-cpp-prompt-lookup")

#: The peers (other engines' methods): what each is, and the drafter of ours it is reported
#: beside (``None``: after all of ours; the baseline comes first).
PEERS = {
    "hf-generate": ("Hugging Face generate, plain (the baseline)", None),
    "hf-prompt-lookup": ("HF assisted generation, prompt_lookup_num_tokens", "prompt-lookup"),
    "hf-early-exit": ("HF assisted generation, assistant_early_exit (layer skip)",
                      "self-speculative"),
    "hf-assisted": ("HF assisted generation, assistant_model", "draft-model"),
    "llama-cpp": ("llama.cpp (llama-cpp-python) on the same GGUF file, plain", None),
    "llama-cpp-prompt-lookup": ("llama.cpp (llama-cpp-python), its prompt-lookup drafter", None),
}

#: The peers that need a draft model.
DRAFT_PEERS = ("hf-assisted",)


def method_descriptions() -> dict:
    """Every method name, in report order, with what it is: the baseline, then ours (one per
    registered drafter, :mod:`specdec_kernels.drafters`), each followed by its peers, then the
    other peers."""
    out = {BASELINE: PEERS[BASELINE][0]}
    for entry in drafters.specs():
        plain = entry.drafter is None
        out[entry.method_name] = entry.description if plain else f"ours, {entry.description}"
        out.update({n: what for n, (what, beside) in PEERS.items() if beside == entry.name})
    out.update({n: what for n, (what, beside) in PEERS.items()
                if beside is None and n != BASELINE})
    return out


def method_drafters() -> dict:
    """Our methods with a drafter, and its registry name."""
    return {e.method_name: e.name for e in drafters.specs() if e.drafter is not None}


def draft_methods() -> tuple:
    """The methods that need a draft model."""
    ours = tuple(e.method_name for e in drafters.specs() if e.needs_draft_model)
    return ours + DRAFT_PEERS


class _Current(Mapping):
    """A read-only mapping made afresh from the drafter registry at every use."""

    def __init__(self, make):
        self._make = make

    def __getitem__(self, key):
        return self._make()[key]

    def __iter__(self):
        return iter(self._make())

    def __len__(self) -> int:
        return len(self._make())

    def __repr__(self) -> str:
        return repr(self._make())


#: :func:`method_descriptions`, always current.
METHOD_DESCRIPTIONS = _Current(method_descriptions)

#: :func:`method_drafters`, always current.
METHOD_DRAFTERS = _Current(method_drafters)


def check_method_names(names: list, *, has_draft: bool) -> None:
    """Raise ``ValueError`` for an unknown method name, or a draft-model method without a
    draft model (checked before any model is loaded)."""
    unknown = [n for n in names if n not in METHOD_DESCRIPTIONS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHOD_DESCRIPTIONS)}")
    needs_draft = [n for n in names if n in draft_methods()]
    if needs_draft and not has_draft:
        raise ValueError(f"{needs_draft} need a draft model (--draft)")


def build_methods(
    names: list,
    model,
    tokenizer,
    *,
    draft_model=None,
    draft_tokenizer=None,
    exit_layer: int | None = None,
    prompt_lookup_tokens: int = 10,
    drafter_options: dict | None = None,
    cpu_kernels: bool | None = None,
    medusa_heads=None,
    medusa_cost_curve=None,
    gguf_path=None,
    memory_tokens: int | None = None,
) -> dict:
    """The requested methods, ready to run.

    Parameters
    ----------
    names : list of str
        Keys of :data:`METHOD_DESCRIPTIONS`.
    model, tokenizer
        The target and its tokenizer.
    draft_model, draft_tokenizer : optional
        The draft model of ``ours-draft-model`` / ``hf-assisted`` and its own tokenizer
        (checked against the target's).
    exit_layer : int, optional
        Layers the self-speculative drafts use, ours and HF's alike.
    prompt_lookup_tokens : int
        HF's ``prompt_lookup_num_tokens``.
    drafter_options : dict, optional
        Constructor options of our drafters by drafter name (see :data:`METHOD_DRAFTERS`),
        e.g. ``{"draft-model": {"adaptive": True}}``.
    cpu_kernels : bool, optional
        Whether our methods use the package's CPU kernels (see :func:`specdec_kernels.generate`;
        default: on for CPU models).
    medusa_heads : str or MedusaHeads, optional
        The heads of our drafters that read Medusa heads (``ours-medusa``, ``ours-blockwise``,
        ``ours-multi``: those whose options declare ``heads``; a folder or
        :class:`~specdec_kernels.medusa.MedusaHeads`); the heads shipped for the default model
        when ``None`` (loaded once, shared by every run).
    medusa_cost_curve : str, optional
        The step-cost JSON their trees are derived from (see
        :class:`~specdec_kernels.decoding.cost.StepCost`).
    gguf_path : str, optional
        The target's GGUF file, for the llama.cpp peers.
    memory_tokens : int, optional
        Give the drafters that read a suffix memory (``ours-suffix``, ``ours-multi`` with its
        suffix prophet) a
        :class:`~specdec_kernels.decoding.SuffixMemory` of this many tokens, one per method,
        kept from run to run (the repeated-task workload); none by default.

    Raises
    ------
    ValueError
        An unknown name, a draft-model method without a draft model, a draft tokenizer that
        differs from the target's, bad drafter options, or a llama.cpp peer without a GGUF
        file or without llama-cpp-python.
    """
    from specdec_kernels.decoding import SuffixMemory
    from specdec_kernels.decoding.api import make_drafter
    from specdec_kernels.decoding.draft_model import check_same_vocabulary
    from specdec_kernels.decoding.self_speculative import DEFAULT_LAYERS_SKIPPED

    check_method_names(names, has_draft=draft_model is not None)
    if any(n in draft_methods() for n in names):
        check_same_vocabulary(tokenizer, draft_tokenizer)
    options = drafter_options or {}
    ours = {e.method_name: e.name for e in drafters.specs() if e.method_name in names}
    if any(_takes(d, "heads") for d in ours.values()):
        from specdec_kernels.medusa.heads import load_heads

        if medusa_heads is None:
            from specdec_kernels.decoding.medusa import load_default_heads

            medusa_heads = load_default_heads()
        elif not hasattr(medusa_heads, "num_heads"):
            medusa_heads = load_heads(medusa_heads)
    # Ours and HF's layer skip exit at the same layer, so they compare like for like.
    depth = model.config.num_hidden_layers
    layers = exit_layer or max(1, depth - DEFAULT_LAYERS_SKIPPED)

    def our_method(name, drafter):
        # The bench's own flags set these options of every drafter that declares them.
        given = dict(options.get(drafter, {}))
        if _takes(drafter, "heads"):  # the Medusa heads, loaded once, and their cost curve
            given = {"heads": medusa_heads, "cost_curve": medusa_cost_curve, **given}
        if _takes(drafter, "num_layers"):
            given = {"num_layers": layers, **given}
        memory = None
        if memory_tokens is not None and _reads_memory(drafter, given):
            memory = given["memory"] = SuffixMemory(memory_tokens)  # one per method
        if drafters.spec(drafter).needs_draft_model:
            given.update(draft_model=draft_model, draft_tokenizer=draft_tokenizer)
        return OursMethod(name, model, tokenizer, lambda: make_drafter(drafter, **given),
                          memory=memory, cpu_kernels=cpu_kernels)

    factories = {name: (lambda name=name, d=d: our_method(name, d)) for name, d in ours.items()}
    factories.update({
        "hf-generate": lambda: HFMethod("hf-generate", model, tokenizer),
        "hf-prompt-lookup": lambda: HFMethod(
            "hf-prompt-lookup", model, tokenizer, prompt_lookup_num_tokens=prompt_lookup_tokens
        ),
        "hf-early-exit": lambda: HFMethod(
            "hf-early-exit", model, tokenizer, assistant_early_exit=layers
        ),
        "hf-assisted": lambda: HFMethod(
            "hf-assisted", model, tokenizer, assistant_model=draft_model
        ),
    })

    def llama_cpp(name, prompt_lookup):
        from specdec_kernels.bench.llama_cpp import LlamaCppMethod
        from specdec_kernels.decoding.api import eos_token_ids

        if gguf_path is None:
            raise ValueError(f"{name} runs a GGUF file: give a .gguf target (or the default)")
        return LlamaCppMethod(name, gguf_path, eos_token_ids(model, tokenizer),
                              threads=torch.get_num_threads(), prompt_lookup=prompt_lookup)

    factories["llama-cpp"] = lambda: llama_cpp("llama-cpp", 0)
    factories["llama-cpp-prompt-lookup"] = lambda: llama_cpp(
        "llama-cpp-prompt-lookup", prompt_lookup_tokens)
    methods = {name: factories[name]() for name in names}
    for method in methods.values():
        if isinstance(method, OursMethod):
            method.make_drafter()  # bad drafter options fail here, before any run
    return methods


def _takes(drafter: str, option: str) -> bool:
    """Whether the registry's ``drafter`` declares ``option``."""
    return option in drafters.option_fields(drafters.spec(drafter).options)


def _reads_memory(drafter: str, given: dict) -> bool:
    """Whether ``drafter`` (with options ``given``) reads a suffix memory: it declares one,
    and when it merges prophets, one of them reads it."""
    if not _takes(drafter, "memory"):
        return False
    if not _takes(drafter, "prophets"):
        return True
    prophets = given.get("prophets") or drafters.default_prophets()
    if isinstance(prophets, str):
        prophets = [p.strip() for p in prophets.split(",") if p.strip()]
    return any(p in drafters.DRAFTER_NAMES and _takes(p, "memory") for p in prophets)
