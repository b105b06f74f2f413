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
    """One method on one prompt.

    ``target_forwards`` counts full forwards of the target, the prefill included, for every
    method alike (so plain decoding has tau = 1 exactly); ``proposed_at``
    / ``accepted_at`` count drafted and accepted tokens per draft depth (ours only);
    ``drafter_seconds`` is the time spent drafting (ours only).
    """

    tokens: list
    seconds: float
    target_forwards: int | None = None
    forward_widths: list = field(default_factory=list)  # tokens per target forward
    drafter_seconds: float | None = None
    proposed_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)


class ForwardCounter:
    """Records the width (tokens per request) of every forward of a model's last decoder
    layer, through a public forward hook.

    Early-exit drafts never reach the last layer, so only full target forwards are recorded.
    """

    def __init__(self, model):
        layers = model.get_decoder().layers
        self.widths: list = []
        self._handle = layers[-1].register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        self.widths.append(int(hidden.shape[-2]))

    @property
    def count(self) -> int:
        return len(self.widths)

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

    def run(self, prompt_ids: list, max_new_tokens: int, sampling: Sampling) -> RunRecord:
        device = self.model.device
        input_ids = torch.tensor([prompt_ids], device=device)
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
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                    **kwargs,
                )
            _synchronize(device)
            seconds = time.perf_counter() - start
        finally:
            counter.close()
        tokens = out[0, len(prompt_ids):].tolist()
        return RunRecord(
            tokens, seconds, target_forwards=counter.count, forward_widths=counter.widths
        )


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

    def run(self, prompt_ids: list, max_new_tokens: int, sampling: Sampling) -> RunRecord:
        from specdec_kernels.decoding import generate

        counter = ForwardCounter(self.model)
        try:
            start = time.perf_counter()
            out = generate(
                self.model,
                [prompt_ids],
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
            out.tokens[0],
            seconds,
            target_forwards=counter.count,
            forward_widths=counter.widths,
            drafter_seconds=stats.drafter_seconds,
            proposed_at=list(stats.proposed_at),
            accepted_at=list(stats.accepted_at),
        )


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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
    from specdec_kernels.decoding.self_speculative import DEFAULT_EXIT_LAYER_FRACTION

    unknown = [n for n in names if n not in METHOD_DESCRIPTIONS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHOD_DESCRIPTIONS)}")
    needs_draft = [n for n in names if n in ("ours-draft-model", "hf-assisted")]
    if needs_draft and draft_model is None:
        raise ValueError(f"{needs_draft} need a draft model (--draft)")
    # Ours and HF's layer skip exit at the same layer, so they compare like for like.
    depth = model.config.num_hidden_layers
    layers = exit_layer or max(1, round(depth * DEFAULT_EXIT_LAYER_FRACTION))
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
