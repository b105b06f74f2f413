"""The decoding engine on every device (CUDA too, where the kernels are built and a GPU is
visible), on tiny random Llama and Qwen2 models with the head dims of real models (64, 128:
the tree-attention kernel's tensor-core sizes in 2-byte dtypes) and prompts long enough that
the kernel splits the prefix. Every drafter runs through sdpa with 4-D masks and through the
registered tree-attention kernel, so verification, KV compaction and tree attention all run on
the device.

- float32: greedy output equals Hugging Face ``generate`` token for token.
- bfloat16 / float16: rounding differs between one-token and block forwards, so exact
  agreement is not expected; instead every emitted token must be a near-argmax of a float32
  copy of the same weights given the tokens emitted before it. A wrong mask, a stale cache row
  or a misplaced compaction picks tokens far from the argmax.
"""

import copy

import pytest
import torch

from python_tests.conftest import DEVICES
from python_tests.decoding_helpers import hf_greedy, tiny_model, truncated_copy
from specdec_kernels.decoding import (
    DraftModelDrafter,
    PromptLookupDrafter,
    SelfSpeculativeDrafter,
    generate,
)
from specdec_kernels.models.hf_tree_attention import register_tree_attention

NEW_TOKENS = 12
VOCAB = 96
# Real head dims with few heads and layers: cheap on CPU, tensor-core sizes on the GPU.
SHAPES = {
    "llama-d64": dict(family="llama", head_dim=64, num_attention_heads=4, num_key_value_heads=2),
    "qwen2-d128": dict(family="qwen2", head_dim=128, num_attention_heads=2, num_key_value_heads=1),
}
DRAFTERS = ["prompt-lookup", "self-speculative", "draft-model-copy"]


def shaped_model(shape, dtype=torch.float32, device="cpu"):
    spec = dict(SHAPES[shape])
    family = spec.pop("family")
    hidden = spec["head_dim"] * spec["num_attention_heads"]
    # initializer_range 0.1 (not the helpers' 0.3): attention scores stay moderate, so a
    # low-precision forward lands within a few hundredths of the float32 logits, far below the
    # gap between the best token and the next (0.3 gives near-one-hot attention that rounding
    # can flip).
    model = tiny_model(family, vocab=VOCAB, layers=2, hidden_size=hidden,
                       intermediate_size=2 * hidden, initializer_range=0.1, **spec)
    return model.to(device, dtype)


def long_ragged_prompts(gen):
    """Three prompts of 65 to 137 tokens (one to three 64-key split granules of the kernel)
    with repeated stretches, so prompt lookup proposes trees."""
    base = torch.randint(0, VOCAB, (30,), generator=gen).tolist()
    return [base * 2 + base[3:8], base * 3 + base[:7], base * 4 + base[5:22]]


def make_drafter(name, model):
    """Drafters whose drafts are mostly rejected (prompt lookup on a random model, one layer of
    two) and one whose drafts are all accepted (a full copy of the target as draft model)."""
    if name == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=2, max_depth=4, max_branches=3)
    if name == "self-speculative":
        return SelfSpeculativeDrafter(num_layers=1, num_draft=3)
    if name == "draft-model-copy":
        return DraftModelDrafter(truncated_copy(model, model.config.num_hidden_layers), num_draft=3)
    raise ValueError(name)


@pytest.mark.parametrize("attention", ["sdpa", "tree-kernel"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("device", DEVICES)
def test_float32_greedy_matches_hf_generate(device, shape, attention):
    model = shaped_model(shape, device=device)
    prompts = long_ragged_prompts(torch.Generator().manual_seed(1))
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    if attention == "tree-kernel":
        model.set_attn_implementation(register_tree_attention())
    for name in [None, *DRAFTERS]:
        drafter = None if name is None else make_drafter(name, model)
        out = generate(model, prompts, drafter=drafter, max_new_tokens=NEW_TOKENS)
        assert out.tokens == expected, name
        proposed = sum(sum(r.proposed_at) for r in out.stats.requests)
        assert name is None or proposed > 0, name
        if name == "draft-model-copy":  # 3 drafts, all accepted: 4 tokens a forward
            assert out.stats.target_forwards <= NEW_TOKENS // 4 + 1


def logit_gaps(reference, prompt, tokens):
    """How far below the best logit each emitted token's logit is, under ``reference``
    (float64 logits of a float32 model on CPU), given the tokens emitted before it."""
    ids = torch.tensor([prompt + tokens])
    with torch.inference_mode():
        logits = reference(ids).logits[0, len(prompt) - 1 : -1].double()
    chosen = logits.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    return logits.max(-1).values - chosen, logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("device", DEVICES)
def test_low_precision_tree_kernel_emits_near_greedy_tokens(device, shape, dtype):
    model = shaped_model(shape, dtype=dtype, device=device)
    # The weights the low-precision model holds, computed in float32: its exact function.
    reference = copy.deepcopy(model).to("cpu", torch.float32)
    model.set_attn_implementation(register_tree_attention())
    prompts = long_ragged_prompts(torch.Generator().manual_seed(2))
    for name in DRAFTERS:
        out = generate(model, prompts, drafter=make_drafter(name, model),
                       max_new_tokens=NEW_TOKENS)
        for prompt, tokens in zip(prompts, out.tokens):
            assert len(tokens) == NEW_TOKENS
            gaps, logits = logit_gaps(reference, prompt, tokens)
            # Measured on CPU: logits spread by about 1.6 (their standard deviation over the
            # vocabulary), emitted tokens at most 0.03 below the best; a wrong token costs
            # about the spread.
            spread = logits.std(-1).mean().item()
            assert spread > 1.0
            assert gaps.max().item() <= 0.1 * spread, (name, gaps.tolist())
            assert (gaps == 0).double().mean().item() >= 0.75, (name, gaps.tolist())
