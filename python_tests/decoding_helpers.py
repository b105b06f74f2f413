"""Shared helpers of the decoding tests: tiny random-weight models of several families, the
default model, the dev prompts and the Hugging Face greedy baseline."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

from specdec_kernels.data import load_prompts

# Twenty dev questions over all 13 categories, short and long (summarization, RAG).
TEST_QUESTION_IDS = [
    85, 81, 91, 103, 117, 125, 127, 135, 141, 157,
    159, 193, 239, 277, 275, 325, 329, 455, 449, 503,
]  # fmt: skip


def dev_prompts() -> list:
    """The test questions' first turns (the packaged copy of ``../shared/data``)."""
    rows = {r["question_id"]: r for r in load_prompts()}
    return [rows[i]["turns"][0] for i in TEST_QUESTION_IDS]


def default_model_missing() -> str | None:
    """Why the bundled default model cannot be loaded here, or None when it can: its package
    must be installed, and its GGUF file either already converted (cached) or convertible
    (``gguf`` installed)."""
    from specdec_kernels.models import converted_gguf_dir, default_gguf_path
    from specdec_kernels.models.loading import _COMPLETE_MARKER

    try:
        path = default_gguf_path()
    except FileNotFoundError as error:
        return str(error)
    if (converted_gguf_dir(path) / _COMPLETE_MARKER).is_file():
        return None
    if importlib.util.find_spec("gguf") is None:
        return f"{path.name} is not converted yet and converting it needs gguf (pip install gguf)"
    return None


@functools.lru_cache(maxsize=None)
def default_model():
    """The bundled default model in fp32 (converted once, then loaded from the cache). Where it
    cannot be loaded (the GPU machine has neither its package nor gguf) the calling test skips,
    marked ``default_model`` or not."""
    from specdec_kernels.models import load_default_model

    reason = default_model_missing()
    if reason is not None:
        pytest.skip(f"needs the bundled default model: {reason}")

    return load_default_model(dtype=torch.float32, weights="float32")


def cli_plain_greedy(prompt: str, max_new_tokens: int, *options) -> list:
    """``specdec generate --drafter none`` (the engine's plain greedy loop on the model the
    command line loads: the default model at its file's precision) for one prompt: the
    reference of the command line's speculative output. (HF ``generate`` on the same weights
    is not: its attention rounds otherwise, and the activations' int8 rounding turns that into
    logit differences of ~0.5% that can flip a greedy token within a few.)"""
    import contextlib
    import io
    import json

    from specdec_kernels import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["generate", prompt, "--drafter", "none", "--max-new-tokens",
                         str(max_new_tokens), "--json", *options]) == 0
    return json.loads(out.getvalue())["tokens"][0]


def tiny_config(family: str, vocab: int, layers: int, **overrides):
    """A small config of a model family; weights large enough to give peaked logits."""
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    common.update(overrides)
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common)
    if family == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common)
    if family == "mistral":
        from transformers import MistralConfig

        common.setdefault("sliding_window", None)
        return MistralConfig(**common)
    if family == "gemma3":
        from transformers import Gemma3TextConfig

        common.setdefault("sliding_window", 5)
        common["layer_types"] = [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
        ]
        return Gemma3TextConfig(**common)
    raise ValueError(family)


def tiny_model(family="llama", *, vocab=64, layers=3, seed=0, dtype=torch.float32, **overrides):
    """A random-weight causal LM of ``family`` (deterministic for a seed), in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, vocab, layers, **overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.to(dtype).eval().requires_grad_(False)


def randomise_norms(model, seed: int = 7):
    """Give every RMSNorm of ``model`` random weights in [0.5, 1.5) (norms of weight 1 would
    hide a swapped norm); returns the model."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            weight = module._parameters.get("weight")
            weight.copy_(torch.rand(weight.shape, generator=gen) + 0.5)
    return model


def truncated_copy(model, num_layers: int):
    """A separate model made of ``model``'s first ``num_layers`` layers (a cheap draft model
    that shares the target's tokenizer and agrees with it often)."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    draft = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, _ = draft.load_state_dict(model.state_dict(), strict=False)
    assert not [k for k in missing if "rotary" not in k], missing
    return draft.to(model.device).eval().requires_grad_(False)


@torch.inference_mode()
def hf_greedy(model, prompt: list, max_new_tokens: int, eos_token_id=None) -> list:
    """Hugging Face ``generate`` greedy continuation of one prompt (new tokens only)."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id if eos_token_id is not None else 0,
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def first_divergence_gap(model, prompt: list, got: list, want: list):
    """Where two greedy continuations of ``prompt`` first differ, the target's own preference
    for ``want`` over ``got`` there: ``(index, logit[want] - logit[got], scale)`` from one
    plain forward (``scale`` is the largest absolute logit), or ``None`` if one continuation
    is a prefix of the other."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            ids = torch.tensor([prompt + want[:i]], device=model.device)
            logits = model(ids).logits[0, -1].float()
            return i, float(logits[w] - logits[g]), float(logits.abs().max())
    return None


def assert_same_or_near_tie(model, prompt, got, want, rel=1e-4, what=""):
    """``got`` equals ``want`` (a greedy reference computed with other kernels), or they part
    where the target's two choices are within ``rel`` of the logit scale of each other: a
    rounding difference, not a bug."""
    if got == want:
        return
    gap = first_divergence_gap(model, prompt, got, want)
    assert gap is not None and abs(gap[1]) <= rel * gap[2], (
        f"{what}: greedy outputs part at token {gap and gap[0]} with logit gap "
        f"{gap and gap[1]:.3g} (scale {gap and gap[2]:.3g}): not a near-tie"
    )


def random_heads(hidden, vocab, num_heads=3, layers=1, *, seed=0, std=0.3, **kwargs):
    """Medusa heads of the given sizes with normal(0, ``std``) weights, seeded."""
    from specdec_kernels.medusa.heads import MedusaHeads

    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, vocab, num_heads, layers, **kwargs)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, std)
    return heads


def random_eagle(target, draft_vocab=None, *, seed=0, std=0.2, capture=(0, 1, 2)):
    """An EAGLE-3 draft sized for ``target`` with normal(0, ``std``) weights, seeded (a draft
    vocabulary of ``draft_vocab`` random ids when given)."""
    from specdec_kernels.eagle import EagleConfig, EagleDraftModel

    vocab = int(target.config.vocab_size)
    torch.manual_seed(seed)
    ids = None if draft_vocab is None else torch.randperm(vocab)[:draft_vocab].sort().values
    size = vocab if draft_vocab is None else draft_vocab
    draft = EagleDraftModel(EagleConfig.for_target(target.config, size, capture), ids)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, std)
    return draft
