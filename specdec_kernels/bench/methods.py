"""The decoding methods a benchmark compares: ours (plain and with each drafter) and the peers
a user would otherwise pick (Hugging Face ``generate``, plain and assisted)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

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
    """

    tokens: list
    seconds: float
    forward_widths: list = field(default_factory=list)
    forward_rows: list = field(default_factory=list)
    drafter_seconds: float | None = None
    proposed_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)
    first_token_from_prefill: bool = True

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


class ForwardCounter:
    """Records the width (tokens per request) and the rows (requests) of every forward of a
    model's last decoder layer, through a public forward hook.

    Early-exit drafts never reach the last layer, so only full target forwards are recorded.
    """

    def __init__(self, model):
        layers = model.get_decoder().layers
        self.widths: list = []
        self.rows: list = []
        self._handle = layers[-1].register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        self.widths.append(int(hidden.shape[-2]))
        self.rows.append(int(hidden.shape[0]) if hidden.dim() == 3 else 1)

    def close(self) -> None:
        self._handle.remove()


class HFMethod:
    """``model.generate`` with fixed extra keyword arguments (assisted generation options)."""

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
        try:
            start = time.perf_counter()
            with torch.inference_mode():
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
    """:func:`specdec_kernels.generate` with one drafter (or none)."""

    kind = "ours"

    def __init__(self, name: str, model, tokenizer, make_drafter, **generate_kwargs):
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.make_drafter = make_drafter  # a fresh drafter per run: drafters keep state
        self.generate_kwargs = generate_kwargs
        self.settings: dict = {}

    def run(self, prompts: list, max_new_tokens: int, sampling: Sampling) -> RunRecord:
        """Generate for a batch of prompts (token id lists)."""
        from specdec_kernels.decoding import generate

        counter = ForwardCounter(self.model)
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
        return RunRecord(
            out.tokens,
            seconds,
            forward_widths=counter.widths,
            forward_rows=counter.rows,
            drafter_seconds=stats.drafter_seconds,
            proposed_at=list(stats.proposed_at),
            accepted_at=list(stats.accepted_at),
            first_token_from_prefill=False,
        )


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


#: HF assisted generation refuses batches of more than one prompt.
BATCH_ONE_METHODS = ("hf-prompt-lookup", "hf-early-exit", "hf-assisted")

#: Every method name, in report order, with what it is.
METHOD_DESCRIPTIONS = {
    "hf-generate": "Hugging Face generate, plain (the baseline)",
    "ours-autoregressive": "specdec_kernels.generate without a drafter",
    "ours-prompt-lookup": "ours, prompt lookup (n-gram matches merged into a tree)",
    "hf-prompt-lookup": "HF assisted generation, prompt_lookup_num_tokens",
    "ours-self-speculative": "ours, layer-skip self-speculation (first L layers draft)",
    "hf-early-exit": "HF assisted generation, assistant_early_exit (layer skip)",
    "ours-draft-model": "ours, a separate draft model",
    "hf-assisted": "HF assisted generation, assistant_model",
}


def build_methods(
    names: list,
    model,
    tokenizer,
    *,
    draft_model=None,
    exit_layer: int | None = None,
    prompt_lookup_tokens: int = 10,
) -> dict:
    """The requested methods, ready to run.

    Raises
    ------
    ValueError
        An unknown name, or a draft-model method without a draft model.
    """
    from specdec_kernels.decoding import (
        DraftModelDrafter,
        PromptLookupDrafter,
        SelfSpeculativeDrafter,
    )
    from specdec_kernels.decoding.self_speculative import DEFAULT_LAYERS_SKIPPED

    unknown = [n for n in names if n not in METHOD_DESCRIPTIONS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHOD_DESCRIPTIONS)}")
    needs_draft = [n for n in names if n in ("ours-draft-model", "hf-assisted")]
    if needs_draft and draft_model is None:
        raise ValueError(f"{needs_draft} need a draft model (--draft)")
    # Ours and HF's layer skip exit at the same layer, so they compare like for like.
    depth = model.config.num_hidden_layers
    layers = exit_layer or max(1, depth - DEFAULT_LAYERS_SKIPPED)
    factories = {
        "hf-generate": lambda: HFMethod("hf-generate", model, tokenizer),
        "ours-autoregressive": lambda: OursMethod(
            "ours-autoregressive", model, tokenizer, lambda: None
        ),
        "ours-prompt-lookup": lambda: OursMethod(
            "ours-prompt-lookup", model, tokenizer, PromptLookupDrafter
        ),
        "hf-prompt-lookup": lambda: HFMethod(
            "hf-prompt-lookup", model, tokenizer, prompt_lookup_num_tokens=prompt_lookup_tokens
        ),
        "ours-self-speculative": lambda: OursMethod(
            "ours-self-speculative", model, tokenizer, lambda: SelfSpeculativeDrafter(layers)
        ),
        "hf-early-exit": lambda: HFMethod(
            "hf-early-exit", model, tokenizer, assistant_early_exit=layers
        ),
        "ours-draft-model": lambda: OursMethod(
            "ours-draft-model", model, tokenizer,
            lambda: DraftModelDrafter(draft_model, tokenizer=tokenizer),
        ),
        "hf-assisted": lambda: HFMethod(
            "hf-assisted", model, tokenizer, assistant_model=draft_model
        ),
    }
    return {name: factories[name]() for name in names}
