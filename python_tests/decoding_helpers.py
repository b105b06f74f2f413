"""Shared helpers of the decoding tests: tiny random-weight models of several families, the
default model, the dev prompts and the Hugging Face greedy baseline."""

from __future__ import annotations

import functools

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


@functools.lru_cache(maxsize=None)
def default_model():
    """The bundled default model in fp32 (converted once, then loaded from the cache)."""
    from specdec_kernels.models import load_default_model

    return load_default_model(dtype=torch.float32)


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
    return draft.eval().requires_grad_(False)


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
