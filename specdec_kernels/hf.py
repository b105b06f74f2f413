"""Speculative decoding inside Hugging Face ``generate`` (transformers 5.x ``custom_generate``).

Two routes, one loop (the :class:`~specdec_kernels.decoding.Engine` every method shares):

- The callable: ``model.generate(**inputs, custom_generate=specdec_kernels.hf.generate,
  drafter="prompt-lookup", max_new_tokens=64, do_sample=True, temperature=0.7, top_p=0.9)``.
  transformers prepares the inputs, the generation config, the logits processors and the
  stopping criteria, then calls :func:`generate` instead of its own sampling loop.
- The folder: ``specdec export-custom-generate DIR`` writes ``DIR/custom_generate/generate.py``
  (what the Hub route loads), so ``model.generate(**inputs, custom_generate="DIR" or
  "user/repo", trust_remote_code=True, drafter=...)`` runs the same loop; that route also
  receives ``tokenizer`` (for ``stop_strings``) and ``streamer`` directly.

What is honoured: greedy or sampling (``do_sample``, ``temperature``, ``top_k``, ``top_p``,
``min_p``: fused into the verification kernels), EOS ids, ``max_new_tokens`` / ``max_length``,
``min_new_tokens`` / ``min_length`` (EOS masked in the target's distribution), every stopping
criterion transformers built (stop strings, max time, the caller's own, evaluated per emitted
token with ``scores=None``), ``num_return_sequences`` (independent random streams), batches
with left padding, streamers (batch size 1: each step's accepted tokens are put at once) and
``return_dict_in_generate`` (a ``GenerateDecoderOnlyOutput`` holding ``sequences``; finished
rows padded with ``pad_token_id`` like transformers). Greedy output equals
``model.generate``'s; sampled output has its distribution (the random streams are this
package's: the same ``torch.manual_seed`` gives the same output, not transformers' output).

What raises ``ValueError`` instead of silently decoding differently: beam search (and
constrained, group, contrastive, DoLa, transformers' own assisted generation: pass a
``drafter``), logits processors other than the sampling filters and ``min_length`` /
``min_new_tokens`` (repetition penalty, bad words, ``logits_processor=``, ...), the
``output_scores`` / ``output_logits`` / ``output_attentions`` / ``output_hidden_states``
outputs, ``synced_gpus``, encoder-decoder models, inputs other than ``input_ids`` and
``attention_mask``, right padding, continuing from a filled cache, and a streamer with more
than one sequence.

transformers 5.x passes a ``custom_generate`` callable neither the ``streamer`` nor the
``tokenizer`` given to ``generate``: :func:`generate` reads the streamer from the calling
``generate``'s frame (so ``streamer=`` works on the callable route), and ``stop_strings``
need the folder route or ``stopping_criteria=[StopStringCriteria(tokenizer, [...])]`` (on the
callable route transformers itself refuses stop strings without a tokenizer).
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import textwrap
from pathlib import Path

import torch

__all__ = ["export_custom_generate", "generate", "generate_from_hub"]

_SUPPORTED_MODES = ("greedy_search", "sample")
# Besides every name of the cache argument (models.hf_compat, imported when generating: the
# command line registers this module's subcommand without loading the models package).
_MODEL_INPUTS = {
    "attention_mask",
    "position_ids",
    "use_cache",
    "logits_to_keep",
    "cache_position",
}


def _hf_generate_code():
    from transformers import GenerationMixin

    return inspect.unwrap(GenerationMixin.generate).__code__


def _caller_local(frame, name: str):
    """``name`` in the frame of transformers' ``generate`` that called us (or None)."""
    if frame is not None and frame.f_code is _hf_generate_code():
        return frame.f_locals.get(name)
    return None


def generate(
    model,
    input_ids=None,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    synced_gpus: bool = False,
    streamer=None,
    *,
    drafter=None,
    draft_model=None,
    **model_kwargs,
):
    """Speculative decoding as a transformers ``custom_generate`` callable.

    ``model.generate(**inputs, custom_generate=specdec_kernels.hf.generate, drafter=...,
    max_new_tokens=..., do_sample=..., temperature=..., top_p=...)``: transformers prepares
    the inputs and the generation config and calls this instead of its decoding loop. Called
    directly (``generate(model, input_ids=..., attention_mask=..., max_new_tokens=...)``), it
    goes through ``model.generate`` the same way.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder-only causal LM, unmodified.
    input_ids : Tensor
        ``[B, P]`` prompts, left-padded when ragged (``attention_mask`` 0 on the padding).
    logits_processor, stopping_criteria, generation_config, synced_gpus, streamer
        What transformers passes (see the module docstring for what is supported).
    drafter : Drafter or str, optional
        A :class:`~specdec_kernels.decoding.Drafter` or a registered drafter name
        (:data:`specdec_kernels.drafters.DRAFTER_NAMES`: ``"prompt-lookup"``, ``"medusa"``,
        ``"draft-model"`` with ``draft_model``, ...), made with its defaults; plain decoding
        when omitted.
    draft_model : transformers.PreTrainedModel, optional
        The draft model for ``drafter="draft-model"`` (same tokenizer as the target).
    **model_kwargs
        ``attention_mask`` and what transformers adds (``position_ids``, an empty cache).

    Returns
    -------
    Tensor or GenerateDecoderOnlyOutput
        ``[B, P + N]`` sequences (prompt then new tokens, finished rows padded with
        ``pad_token_id``), wrapped when ``return_dict_in_generate``.

    Raises
    ------
    ValueError
        Unsupported generation modes, processors, outputs, inputs or padding (module docstring).
    """
    caller = sys._getframe(1)
    if generation_config is None:  # called directly: let transformers prepare everything
        return generate_from_hub(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            streamer=streamer,
            drafter=drafter,
            draft_model=draft_model,
            synced_gpus=synced_gpus or None,
            **model_kwargs,
        )
    if streamer is None:
        # transformers does not pass a callable custom_generate the streamer it was given.
        streamer = _caller_local(caller, "streamer")
    if _caller_local(caller, "assistant_model") is not None:
        raise ValueError(
            "assistant_model selects transformers' own assisted generation; with "
            "custom_generate=specdec_kernels.hf.generate pass drafter='draft-model', "
            "draft_model=<the assistant> (or drafter=DraftModelDrafter(assistant))"
        )
    tokenizer = model_kwargs.pop("tokenizer", None)
    return _decode(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        drafter,
        draft_model,
        tokenizer,
        model_kwargs,
    )


def generate_from_hub(
    model,
    inputs=None,
    generation_config=None,
    logits_processor=None,
    stopping_criteria=None,
    prefix_allowed_tokens_fn=None,
    synced_gpus=None,
    assistant_model=None,
    streamer=None,
    negative_prompt_ids=None,
    negative_prompt_attention_mask=None,
    *,
    drafter=None,
    draft_model=None,
    tokenizer=None,
    stop_strings=None,
    **kwargs,
):
    """The ``custom_generate/generate.py`` entry point (the Hub / local-folder route).

    transformers calls it with every argument of ``generate``; it runs transformers' input
    preparation with :func:`generate` as the decoding loop. Unlike the callable route it gets
    ``tokenizer`` and ``streamer`` directly, so ``stop_strings=..., tokenizer=...`` work.

    Raises
    ------
    ValueError
        ``assistant_model``, ``prefix_allowed_tokens_fn`` or negative prompts (not supported),
        ``stop_strings`` without a tokenizer, and everything :func:`generate` refuses.
    """
    from transformers import GenerationMixin, StoppingCriteriaList, StopStringCriteria

    if assistant_model is not None:
        raise ValueError(
            "assistant_model selects transformers' own assisted generation; pass "
            "drafter='draft-model', draft_model=<the assistant> instead"
        )
    if prefix_allowed_tokens_fn is not None or negative_prompt_ids is not None:
        raise ValueError(
            "prefix_allowed_tokens_fn and negative prompts are logits processors that "
            "specdec_kernels.hf.generate does not support"
        )
    # transformers drops the tokenizer before a custom loop's stopping criteria are built, so
    # stop strings (given, in generation_config or saved in the model's) become a criterion here.
    saved = model.generation_config.stop_strings
    given = generation_config.stop_strings if generation_config is not None else None
    if stop_strings is None:
        stop_strings = given if given is not None else saved
    if given is not None:
        generation_config = copy.deepcopy(generation_config)
        generation_config.stop_strings = None
    if stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings need the model's tokenizer: pass tokenizer=...")
        stop = StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings)
        stopping_criteria = StoppingCriteriaList([*(stopping_criteria or []), stop])
    loop = functools.partial(
        generate, drafter=drafter, draft_model=draft_model, streamer=streamer, tokenizer=tokenizer
    )
    model.generation_config.stop_strings = None  # (restored below) else transformers re-adds them
    try:
        return GenerationMixin.generate(
            model,
            inputs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            synced_gpus=synced_gpus,
            streamer=streamer,
            custom_generate=loop,
            **kwargs,
        )
    finally:
        model.generation_config.stop_strings = saved


# ----------------------------------------------------------------------------- the loop


def _check_mode(generation_config, synced_gpus) -> None:
    mode = str(generation_config.get_generation_mode().value)
    if mode not in _SUPPORTED_MODES:
        hint = {
            "assisted_generation": " (prompt_lookup_num_tokens / assistant_early_exit select "
            "transformers' assisted generation: pass drafter='prompt-lookup' or "
            "drafter='self-speculative' instead)"
        }.get(mode, " (set num_beams=1 and no penalty_alpha / dola_layers / constraints)")
        raise ValueError(
            f"specdec_kernels.hf.generate runs greedy decoding and sampling only, not {mode}{hint}"
        )
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(generation_config, flag, False):
            raise ValueError(
                f"{flag}=True is not supported by specdec_kernels.hf.generate (the verification "
                "kernels decide from the logits without materialising per-token outputs)"
            )
    if synced_gpus:
        raise ValueError("synced_gpus is not supported by specdec_kernels.hf.generate")


def _sampling_settings(logits_processor, generation_config, prompt_width: int):
    """Temperature, top-k, top-p, min-p and the minimum new tokens, read from the processors
    transformers built; anything else is refused."""
    from transformers.generation import logits_process as lp

    settings = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    min_new = 0
    for proc in logits_processor or []:
        if isinstance(proc, lp.TemperatureLogitsWarper):
            settings["temperature"] = float(proc.temperature)
        elif isinstance(proc, lp.TopKLogitsWarper):
            settings["top_k"] = int(proc.top_k)
        elif isinstance(proc, (lp.TopPLogitsWarper, lp.MinPLogitsWarper)):
            if proc.min_tokens_to_keep != 1:
                raise ValueError(f"min_tokens_to_keep={proc.min_tokens_to_keep} is not supported")
            key = "top_p" if isinstance(proc, lp.TopPLogitsWarper) else "min_p"
            settings[key] = float(getattr(proc, key))
        elif isinstance(proc, lp.MinNewTokensLengthLogitsProcessor):
            min_new = max(
                min_new, int(proc.min_new_tokens) - (prompt_width - proc.prompt_length_to_skip)
            )
        elif isinstance(proc, lp.MinLengthLogitsProcessor):
            min_new = max(min_new, int(proc.min_length) - prompt_width)
        else:
            raise ValueError(
                f"logits processor {type(proc).__name__} is not supported by "
                "specdec_kernels.hf.generate: it applies temperature, top-k, top-p and min-p "
                "(fused into its verification kernels) and min_length / min_new_tokens only"
            )
    if not generation_config.do_sample:
        settings = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
    return settings, min_new


def _prompts(input_ids, model_kwargs) -> list:
    """The unpadded prompts of a left-padded batch."""
    from specdec_kernels.models.hf_compat import CACHE_INPUT_NAMES, cache_of

    extra = sorted(set(model_kwargs) - _MODEL_INPUTS - set(CACHE_INPUT_NAMES))
    if extra:
        raise ValueError(
            f"model inputs {extra} are not supported by specdec_kernels.hf.generate "
            "(text-only decoder inputs: input_ids and attention_mask)"
        )
    cache = cache_of(model_kwargs)
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise ValueError("continuing from a filled cache (past_key_values) is not supported")
    if input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        shape = None if input_ids is None else tuple(input_ids.shape)
        raise ValueError(f"input_ids [B, P] with P >= 1 are required, got {shape}")
    mask = model_kwargs.get("attention_mask")
    if mask is None:
        return input_ids.tolist()
    if mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(mask.shape)} must match input_ids {tuple(input_ids.shape)}"
        )
    mask = mask.bool()
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError(
            "the batch is not left-padded (attention_mask has zeros after ones): use a "
            "tokenizer with padding_side='left'"
        )
    if not bool(mask[:, -1].all()):
        raise ValueError("every row of attention_mask needs at least one token")
    return [ids[m].tolist() for ids, m in zip(input_ids, mask)]


def _criteria_stop(stopping_criteria, prompt_rows, max_new, eos_ids, min_new):
    """The engine's stop rule: its own (max tokens, EOS) when those are the only criteria,
    else every criterion transformers built, evaluated after each emitted token."""
    from transformers.generation import stopping_criteria as sc

    from specdec_kernels.decoding import StopCriteria

    batch = len(prompt_rows)
    criteria = list(stopping_criteria or [])
    if all(isinstance(c, (sc.MaxLengthCriteria, sc.EosTokenCriteria)) for c in criteria):
        return StopCriteria(
            [max_new] * batch, eos_ids, [[] for _ in range(batch)], None, [min_new] * batch
        )
    return _transformers_stop_class()(stopping_criteria, prompt_rows, max_new, eos_ids, min_new)


@functools.lru_cache(maxsize=None)
def _transformers_stop_class():
    from specdec_kernels.decoding import StopCriteria

    class TransformersStop(StopCriteria):
        """transformers' stopping criteria, applied to each request's padded row plus its
        output after every emitted token (as transformers' loop applies them per step)."""

        def __init__(self, criteria, prompt_rows, max_new, eos_ids, min_new):
            batch = len(prompt_rows)
            super().__init__(
                [max_new] * batch, eos_ids, [[] for _ in range(batch)], None, [min_new] * batch
            )
            self.criteria = criteria
            self.prompt_rows = prompt_rows

        def cut(self, request, generated, num_new):
            row = self.prompt_rows[request]
            for j in range(len(generated) - num_new, len(generated)):
                if generated[j] in self.eos_ids:
                    return j + 1, "eos"
                if j + 1 >= self.max_new_tokens[request]:
                    return j + 1, "length"
                ids = torch.tensor([row + generated[: j + 1]], dtype=torch.int64)
                if bool(self.criteria(ids, None).any()):
                    return j + 1, "stop_criteria"
            return None, None

    return TransformersStop


def _decode(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus,
    streamer,
    drafter,
    draft_model,
    tokenizer,
    model_kwargs,
):
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    from specdec_kernels.decoding import Engine
    from specdec_kernels.decoding.api import check_prompts, resolve_drafter, sampling_params

    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("specdec_kernels.hf.generate supports decoder-only models only")
    _check_mode(generation_config, synced_gpus)
    prompts = _prompts(input_ids, model_kwargs)
    batch, width = input_ids.shape
    settings, min_new = _sampling_settings(logits_processor, generation_config, width)
    if streamer is not None and batch > 1:
        raise ValueError(
            f"a streamer takes one sequence; got a batch of {batch} (transformers' streamers "
            "support batch size 1)"
        )
    drafter = resolve_drafter(drafter, draft_model=draft_model)

    max_new = int(generation_config.max_length) - width
    if max_new < 1:
        raise ValueError(
            f"max_length={generation_config.max_length} leaves no room after {width} prompt tokens"
        )
    eos = generation_config._eos_token_tensor
    eos_ids = set() if eos is None else {int(t) for t in eos.flatten().tolist()}
    padded_rows = input_ids.tolist()
    stop = _criteria_stop(stopping_criteria, padded_rows, max_new, eos_ids, min_new)

    engine = Engine(model, drafter, tokenizer)
    check_prompts(prompts, engine.runner.vocab_size)
    # One random stream per row, seeded from torch's generator (torch.manual_seed reproduces).
    seeds = torch.randint(0, 2**62, (batch,)).tolist()
    params = sampling_params(batch, engine.runner.device, seed=seeds, **settings)

    on_emit = None
    if streamer is not None:

        def on_emit(request, tokens, finished):
            if tokens:
                streamer.put(torch.tensor(tokens, dtype=torch.int64))

    result = engine.run(prompts, params, stop, on_emit)
    if streamer is not None:
        streamer.end()

    longest = max(len(t) for t in result.tokens)
    pad = generation_config._pad_token_tensor
    pad_id = int(pad.flatten()[0]) if pad is not None else (min(eos_ids) if eos_ids else 0)
    new = torch.full((batch, longest), pad_id, dtype=input_ids.dtype)
    for b, tokens in enumerate(result.tokens):
        new[b, : len(tokens)] = torch.tensor(tokens, dtype=input_ids.dtype)
    sequences = torch.cat([input_ids, new.to(input_ids.device)], 1)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


# ----------------------------------------------------------------------------- the folder form

_GENERATE_PY = '''\
"""Speculative decoding for transformers' `generate`, from the specdec_kernels package.

    model.generate(**inputs, custom_generate="<this repo or folder>", trust_remote_code=True,
                   drafter="prompt-lookup", max_new_tokens=128)

Drafters: any name `specdec generate --drafter` takes ("prompt-lookup", "medusa", "draft-model"
with draft_model=..., ...), or a specdec_kernels.decoding.Drafter object. See the README next
to this folder.
"""

from specdec_kernels.hf import generate_from_hub


def generate(model, *args, **kwargs):
    return generate_from_hub(model, *args, **kwargs)
'''

_README = """\
---
library_name: transformers
tags:
  - custom_generate
---

# Speculative decoding (specdec_kernels)

A `custom_generate` method for transformers 5.x: speculative decoding with CPU and CUDA
verification kernels (greedy output equals the model's own; sampled output has its
distribution), on any decoder-only causal LM, unmodified.

Requires the `specdec_kernels` package in the environment.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("<model>", padding_side="left")
model = AutoModelForCausalLM.from_pretrained("<model>")
inputs = tok(["Summarize: ..."], return_tensors="pt", padding=True)
out = model.generate(**inputs, custom_generate="<this repo or folder>", trust_remote_code=True,
                     drafter="prompt-lookup", max_new_tokens=128)
print(tok.batch_decode(out, skip_special_tokens=True))
```

Arguments added to `generate`: `drafter` (a name that `specdec generate --drafter` takes, e.g.
"prompt-lookup", "medusa", "draft-model", or a `specdec_kernels.decoding.Drafter`),
`draft_model` (for "draft-model"). Supported:
greedy and sampling (temperature, top-k, top-p, min-p), EOS, max/min new tokens, stop strings
(pass `tokenizer=`), streamers (batch size 1), left-padded batches, `return_dict_in_generate`.
Beam search and other logits processors raise an error.
"""


def export_custom_generate(directory, *, overwrite: bool = False) -> Path:
    """Write the ``custom_generate/`` folder form of :func:`generate` into ``directory``.

    Parameters
    ----------
    directory : str or Path
        The repository folder (created if needed); receives ``custom_generate/generate.py``,
        ``custom_generate/requirements.txt`` and ``README.md`` (Hub model-card tags).
    overwrite : bool
        Replace files that exist (otherwise refuse).

    Returns
    -------
    Path
        ``directory``.

    Raises
    ------
    FileExistsError
        A file to write exists and ``overwrite`` is false.
    """
    from specdec_kernels import __version__

    root = Path(directory)
    files = {
        root / "custom_generate" / "generate.py": _GENERATE_PY,
        root / "custom_generate" / "requirements.txt": f"specdec_kernels>={__version__}\n",
        root / "README.md": textwrap.dedent(_README),
    }
    existing = [str(p) for p in files if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} exist; pass overwrite=True (--force) to replace"
        )
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def add_subcommand(subparsers) -> None:
    """Register ``specdec export-custom-generate DIR`` (see ``cli.SUBCOMMAND_MODULES``)."""
    p = subparsers.add_parser(
        "export-custom-generate",
        help="write the custom_generate/ folder for model.generate(custom_generate=DIR)",
        description="Write DIR/custom_generate/generate.py (+ requirements.txt and a README "
        "with the Hub tags): the Hugging Face custom_generate form of the speculative "
        "decoding loop, loadable with model.generate(custom_generate=DIR, "
        "trust_remote_code=True) or from the Hub once DIR is pushed.",
    )
    p.add_argument("directory", help="the repository folder to write")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=_run_export)


def _run_export(args) -> int:
    root = export_custom_generate(args.directory, overwrite=args.force)
    print(f"wrote {root / 'custom_generate' / 'generate.py'}")
    return 0
