"""Every drafter on tiny random-weight Llama, Qwen2 and Gemma3 models (Gemma3 with sliding
window layers): greedy output equals Hugging Face ``generate`` token for token, with ragged
batches, through sdpa with 4D masks or the tree-attention kernel, with or without the
small-batch CPU linear mode; low-precision smoke tests."""

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
from specdec_kernels.decoding.cpu_matmul import SmallBatchLinear
from specdec_kernels.models.hf_tree_attention import register_tree_attention

FAMILIES = ["llama", "qwen2", "gemma3"]
NEW_TOKENS = 20


def ragged_prompts(vocab, gen):
    """Three prompts of different lengths with repeated stretches (so n-grams match)."""
    base = torch.randint(0, vocab, (12,), generator=gen).tolist()
    return [base[:5] + base[:4], base + base[3:9] + base[:5], base[:2] * 2 + base + base[6:]]


def drafters(family, model, device):
    draft = truncated_copy(model, 1).to(device)
    other = tiny_model(family, seed=7).to(device)
    return {
        "prompt-lookup": PromptLookupDrafter(max_ngram=2, max_depth=5, max_branches=3),
        "self-speculative": SelfSpeculativeDrafter(num_layers=1, num_draft=3),
        "draft-model": DraftModelDrafter(draft, num_draft=4),
        "draft-model-random-adaptive": DraftModelDrafter(other, num_draft=2, adaptive=True),
        "draft-model-confidence": DraftModelDrafter(draft, num_draft=5, confidence_threshold=0.3),
    }


@pytest.fixture(
    scope="module",
    params=[(f, d, a) for f in FAMILIES for d in DEVICES for a in ["sdpa", "tree-kernel"]],
    ids=lambda p: "-".join(p),
)
def family_case(request):
    """A tiny model, ragged prompts and HF's greedy output; the engine runs the model with
    sdpa and 4D masks, or with the registered tree-attention kernel."""
    family, device, attention = request.param
    model = tiny_model(family).to(device)
    prompts = ragged_prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    if attention == "tree-kernel":
        model.set_attn_implementation(register_tree_attention())
    return family, device, model, prompts, expected


def test_autoregressive_matches_hf_generate(family_case):
    _, _, model, prompts, expected = family_case
    out = generate(model, prompts, max_new_tokens=NEW_TOKENS)
    assert out.tokens == expected
    assert out.stats.target_forwards == NEW_TOKENS
    assert out.finish_reasons == ["length"] * len(prompts)


@pytest.mark.parametrize(
    "name",
    [
        "prompt-lookup",
        "self-speculative",
        "draft-model",
        "draft-model-random-adaptive",
        "draft-model-confidence",
    ],
)
def test_drafter_greedy_matches_hf_generate(family_case, name):
    family, device, model, prompts, expected = family_case
    drafter = drafters(family, model, device)[name]
    out = generate(model, prompts, drafter=drafter, max_new_tokens=NEW_TOKENS)
    assert out.tokens == expected
    for req in out.stats.requests:
        assert req.new_tokens == NEW_TOKENS
        assert 1 <= req.target_forwards <= NEW_TOKENS
    # batch 1 too: one request at a time
    for prompt, want in zip(prompts[:2], expected[:2]):
        single = generate(model, [prompt], drafter=drafter, max_new_tokens=NEW_TOKENS)
        assert single.tokens == [want]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", FAMILIES)
def test_low_precision_runs(family, dtype):
    """bf16/fp16: every drafter runs, emits the requested number of valid tokens, and the
    cache holds the model's dtype (exact agreement is not expected: rounding differs between
    one-token and block forwards)."""
    model = tiny_model(family, dtype=dtype)
    prompts = ragged_prompts(model.config.vocab_size, torch.Generator().manual_seed(5))
    for name, drafter in drafters(family, model, "cpu").items():
        if name == "draft-model-random-adaptive":
            drafter = DraftModelDrafter(tiny_model(family, seed=7, dtype=dtype), num_draft=2)
        out = generate(model, prompts, drafter=drafter, max_new_tokens=8, temperature=0.7)
        assert [len(t) for t in out.tokens] == [8, 8, 8], name
        assert all(0 <= t < model.config.vocab_size for seq in out.tokens for t in seq)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_small_batch_linear_matches_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(2, rows, 24, generator=gen)[:1]
    weights = [torch.randn(16, 24, generator=gen), torch.randn(9000, 24, generator=gen)]
    b = [torch.randn(w.shape[0], generator=gen) if bias else None for w in weights]
    for w, bb in zip(weights, b):
        want = torch.nn.functional.linear(x, w, bb)
        with SmallBatchLinear():
            got = torch.nn.functional.linear(x, w, bb)
            half = torch.nn.functional.linear(x.half(), w.half())  # not float32: untouched
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got.shape == want.shape and half.dtype == torch.float16


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_cpu_linear_keeps_greedy_output(family):
    model = tiny_model(family)
    prompts = ragged_prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    for name, drafter in drafters(family, model, "cpu").items():
        out = generate(model, prompts, drafter=drafter, max_new_tokens=NEW_TOKENS,
                       fast_cpu_linear=True)
        assert out.tokens == expected, name
