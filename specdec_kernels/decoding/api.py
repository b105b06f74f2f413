"""``specdec_kernels.generate``: speculative decoding on a Hugging Face model in one call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdec_kernels.decoding.drafter import Drafter
from specdec_kernels.decoding.engine import Engine, StopCriteria
from specdec_kernels.decoding.factory import make_drafter
from specdec_kernels.decoding.stats import RunStats
from specdec_kernels.drafters import DRAFTER_NAMES
from specdec_kernels.sampling import SamplingParams

__all__ = [
    "DRAFTER_NAMES",
    "GenerationOutput",
    "check_prompts",
    "generate",
    "make_drafter",
    "resolve_drafter",
    "sampling_params",
]


@dataclass
class GenerationOutput:
    """What :func:`generate` returns.

    Attributes
    ----------
    tokens : list of list of int
        New tokens per request (the prompt excluded; EOS included when it ended the request).
    text : list of str or None
        The new tokens decoded (special tokens skipped) when a tokenizer is known.
    finish_reasons : list of str
        ``"eos"``, ``"stop_string"`` or ``"length"`` per request.
    prompt_tokens : list of list of int
        The token ids each request started from (after the chat template, and truncation
        when ``truncate_prompt`` was asked for).
    stats : RunStats
        Speed and acceptance figures, per run and per request.
    """

    tokens: list
    text: list | None
    finish_reasons: list
    prompt_tokens: list
    stats: RunStats


def _per_request(value, batch: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != batch:
            raise ValueError(f"{name} has {len(value)} entries for {batch} requests")
        return list(value)
    return [value] * batch


def _as_token_lists(inputs, tokenizer, chat_template: bool, device) -> list:
    """Normalise ``inputs`` to lists of token ids, checking devices and emptiness."""
    if isinstance(inputs, str):
        inputs = [inputs]
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 1:
            inputs = inputs[None]
        if inputs.dim() != 2:
            raise ValueError(f"input_ids must be [B, P] or [P], got shape {tuple(inputs.shape)}")
        inputs = list(inputs.unbind(0))
    if not isinstance(inputs, (list, tuple)):
        raise ValueError(
            "inputs must be a prompt, a list of prompts or of token id lists, or a tensor, "
            f"got {type(inputs).__name__}"
        )
    if len(inputs) == 0:
        raise ValueError(
            f"inputs is an empty {type(inputs).__name__}: give at least one prompt"
        )
    if all(isinstance(x, str) for x in inputs):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer (pass tokenizer=...)")
        from specdec_kernels.data import check_prompt_texts
        from specdec_kernels.models import encode_prompts

        return encode_prompts(tokenizer, check_prompt_texts(inputs), chat_template=chat_template)
    tensor_devices = {x.device for x in inputs if isinstance(x, torch.Tensor)}
    if len(tensor_devices) > 1:
        names = ", ".join(sorted(str(d) for d in tensor_devices))
        raise ValueError(f"the prompts' tensors are on several devices ({names}); use one")
    if tensor_devices and (d := tensor_devices.pop()) not in (torch.device("cpu"), device):
        raise ValueError(f"the prompts are on {d} but the model is on {device}")
    lists = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            if x.dim() != 1:
                raise ValueError(f"each prompt tensor must be 1-D, got shape {tuple(x.shape)}")
            x = x.tolist()
        if isinstance(x, str):
            raise ValueError("mix of text and token-id prompts; use one kind")
        lists.append([int(t) for t in x])
    return lists


def fit_context(prompts: list, max_new_tokens: list, context: int, truncate: bool) -> list:
    """Check that each prompt and its new tokens fit the model's context.

    Parameters
    ----------
    prompts : list of list of int
    max_new_tokens : list of int
        Per request.
    context : int
        The model's ``max_position_embeddings``.
    truncate : bool
        Keep the last ``context - max_new_tokens`` tokens of a prompt that does not fit,
        instead of raising.

    Returns
    -------
    list of list of int
        The prompts, truncated where asked.

    Raises
    ------
    ValueError
        A request that does not fit (with ``truncate``: whose ``max_new_tokens`` alone fills
        the context).
    """
    fitted = []
    for i, (prompt, new) in enumerate(zip(prompts, max_new_tokens)):
        if len(prompt) + new <= context:
            fitted.append(prompt)
            continue
        room = context - new
        if room < 1:
            raise ValueError(
                f"max_new_tokens={new} (request {i}) leaves no room for a prompt in the "
                f"model's context of {context} tokens (max_position_embeddings)"
            )
        if not truncate:
            raise ValueError(
                f"prompt {i} has {len(prompt)} tokens; with max_new_tokens={new} that is "
                f"{len(prompt) + new}, more than the model's context of {context} tokens "
                f"(max_position_embeddings). Shorten the prompt, lower max_new_tokens, or "
                f"pass truncate_prompt=True (--truncate-prompt) to keep its last {room} tokens"
            )
        fitted.append(prompt[len(prompt) - room :])
    return fitted


def eos_token_ids(model, tokenizer, eos_token_id=None) -> set:
    """The ids that end a request: ``eos_token_id`` when given, else the model's generation
    config's and the tokenizer's."""
    if eos_token_id is not None:
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        return set(int(i) for i in ids)
    ids = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def resolve_drafter(drafter, *, draft_model=None, draft_tokenizer=None) -> Drafter | None:
    """The drafter of a request: a :class:`Drafter`, or one made by its registered name
    (:func:`make_drafter`, its defaults); ``None`` for plain decoding. Shared by
    :func:`generate` and :func:`specdec_kernels.hf.generate`.

    Raises
    ------
    ValueError
        Neither a drafter nor a name, an unknown name, or a ``draft_model`` for a drafter that
        does not draft with one.
    """
    if isinstance(drafter, str):
        return make_drafter(drafter, draft_model=draft_model, draft_tokenizer=draft_tokenizer)
    if draft_model is not None:
        raise ValueError("draft_model was given: pass drafter='draft-model' to use it")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a Drafter or a drafter name, got {type(drafter).__name__}")
    return drafter


def check_prompts(prompts: list, vocab: int) -> None:
    """Every prompt (a list of token ids) has a token, and every id is in ``[0, vocab)``.

    Raises
    ------
    ValueError
        Naming the first prompt that fails.
    """
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab})")


def sampling_params(batch: int, device, *, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                    seed=0) -> SamplingParams:
    """Per-request sampling parameters, each given once for the batch or as one value per
    request, checked before anything runs.

    Raises
    ------
    ValueError
        A sequence of the wrong length, ``temperature < 0``, ``top_k < 0``, ``top_p`` outside
        ``(0, 1]`` or ``min_p`` outside ``[0, 1)``.
    """
    temps = _per_request(temperature, batch, "temperature")
    if any(t < 0 for t in temps):
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    tops = _per_request(top_p, batch, "top_p")
    if any(not 0 < p <= 1 for p in tops):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    ks = _per_request(top_k, batch, "top_k")
    if any(k < 0 for k in ks):
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    min_ps = _per_request(min_p, batch, "min_p")
    if any(not 0 <= m < 1 for m in min_ps):
        raise ValueError(f"min_p must be in [0, 1), got {min_p}")
    seeds = _per_request(seed, batch, "seed")
    return SamplingParams.create(batch, temperature=temps, top_k=ks, top_p=tops, min_p=min_ps,
                                 seed=seeds, device=device)


def generate(
    model,
    inputs,
    *,
    drafter: Drafter | str | None = None,
    tokenizer=None,
    max_new_tokens: int | Sequence[int] = 128,
    temperature: float | Sequence[float] = 0.0,
    top_k: int | Sequence[int] = 0,
    top_p: float | Sequence[float] = 1.0,
    min_p: float | Sequence[float] = 0.0,
    seed: int | Sequence[int] = 0,
    stop_strings: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    chat_template: bool = True,
    draft_model=None,
    draft_tokenizer=None,
    cpu_kernels: bool | None = None,
    truncate_prompt: bool = False,
    prefill_progress=None,
) -> GenerationOutput:
    """Generate from a causal LM with speculative decoding (or plainly, without a drafter).

    The output equals what the target alone produces: token for token when greedy, in
    distribution when sampling.

    Parameters
    ----------
    model : transformers.PreTrainedModel, LoadedModel or str
        The target. A :class:`~specdec_kernels.models.LoadedModel` brings its tokenizer; a
        string is loaded with :func:`~specdec_kernels.models.load_model` (``"default"``, a
        folder or a ``.gguf`` file).
    inputs : str, list of str, list of list of int, Tensor or list of Tensor
        Prompts as text (the chat template is applied when the tokenizer has one and
        ``chat_template``) or token ids (``[B, P]`` / ``[P]`` tensors or ragged lists).
    drafter : Drafter or str, optional
        A drafter object, or a registered name (:data:`DRAFTER_NAMES`, made by
        :func:`make_drafter` with its defaults; ``"draft-model"`` with ``draft_model``).
        Plain decoding when ``None``.
    tokenizer : optional
        The target's tokenizer (needed for text prompts, stop strings and returned text).
    max_new_tokens : int or sequence of int
        Per request (>= 1).
    temperature, top_k, top_p, min_p : scalar or sequence
        Sampling parameters per request; temperature 0 is greedy.
    seed : int or sequence of int
        Random seed per request (a request's samples do not depend on the rest of the batch).
    stop_strings : str, sequence of str, or one sequence per request, optional
        Generation of a request ends with the token that completes one of them.
    eos_token_id : int or sequence of int, optional
        End-of-sequence ids; by default the model's generation config's and the
        tokenizer's. Pass ``[]`` to never stop at EOS.
    chat_template : bool
        Apply the tokenizer's chat template to text prompts.
    draft_model, draft_tokenizer : optional
        The draft model (and its tokenizer, checked against the target's) for
        ``drafter="draft-model"``.
    cpu_kernels : bool, optional
        On CPU, run the forwards through the package's batch-invariant kernels (small-batch
        linear and tree attention): verifying ``K`` tokens costs about one, and yields exactly
        the logits one-token decoding would. Their rounding differs from torch's, so where two
        tokens nearly tie, greedy output can differ from HF ``generate`` (never from this
        package's own autoregressive decoding). Default: where they measure faster than
        torch's on this machine (``stats.kernels`` says which ran; see
        :mod:`~specdec_kernels.decoding.kernel_choice`).
    truncate_prompt : bool
        A prompt that does not fit the model's context (``max_position_embeddings``)
        together with its ``max_new_tokens`` keeps its last tokens (the start of the chat
        template included in what is dropped); by default it is an error.
    prefill_progress : callable, optional
        ``prefill_progress(done, total)`` with prompt tokens prefilled so far, called when a
        long prefill runs in chunks (see :meth:`~specdec_kernels.decoding.ModelRunner.prefill`);
        e.g. :func:`specdec_kernels.cli.prefill_progress_bar`.

    Returns
    -------
    GenerationOutput

    Raises
    ------
    ValueError
        Empty prompts (a text prompt that is blank too: the chat template alone makes the
        model produce generic text), ``max_new_tokens < 1``, a prompt that with ``max_new_tokens`` exceeds
        the model's context (unless ``truncate_prompt``), bad sampling parameters, prompts on
        another device than the model, token ids outside the vocabulary, or a draft model
        whose tokenizer differs from the target's.
    """
    if isinstance(model, str):
        from specdec_kernels.models import load_model

        model = load_model(model)
    if hasattr(model, "model") and hasattr(model, "tokenizer") and hasattr(model, "source"):
        tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        model = model.model
    if hasattr(draft_model, "model") and hasattr(draft_model, "tokenizer"):
        draft_tokenizer = draft_tokenizer if draft_tokenizer is not None else draft_model.tokenizer
        draft_model = draft_model.model
    drafter = resolve_drafter(drafter, draft_model=draft_model, draft_tokenizer=draft_tokenizer)
    engine = Engine(model, drafter, tokenizer, cpu_kernels=cpu_kernels)
    device = engine.runner.device
    prompts = _as_token_lists(inputs, tokenizer, chat_template, device)
    check_prompts(prompts, engine.runner.vocab_size)
    batch = len(prompts)
    limits = _per_request(max_new_tokens, batch, "max_new_tokens")
    if any(int(n) < 1 for n in limits):
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    context = getattr(engine.runner.config, "max_position_embeddings", None)
    if context:
        prompts = fit_context(prompts, [int(n) for n in limits], int(context), truncate_prompt)
    params = sampling_params(batch, device, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, seed=seed)

    if stop_strings is None:
        stops = [[] for _ in range(batch)]
    elif isinstance(stop_strings, str):
        stops = [[stop_strings] for _ in range(batch)]
    elif all(isinstance(s, str) for s in stop_strings):
        stops = [list(stop_strings) for _ in range(batch)]
    else:
        stops = [[s] if isinstance(s, str) else list(s) for s in stop_strings]
        if len(stops) != batch:
            raise ValueError(f"stop_strings has {len(stops)} entries for {batch} requests")
    if any(stops) and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer (pass tokenizer=...)")
    stop = StopCriteria(
        [int(n) for n in limits], eos_token_ids(model, tokenizer, eos_token_id), stops, tokenizer
    )

    result = engine.run(prompts, params, stop, prefill_progress=prefill_progress)
    text = None
    if tokenizer is not None:
        text = [tokenizer.decode(t, skip_special_tokens=True) for t in result.tokens]
    return GenerationOutput(result.tokens, text, result.finish_reasons, prompts, result.stats)
