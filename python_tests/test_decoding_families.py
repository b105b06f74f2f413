"""Every drafter on tiny random-weight Llama, Qwen2 and Gemma3 models (Gemma3 with sliding
window layers): greedy output equals Hugging Face ``generate`` token for token, with ragged
batches, through torch's kernels (sdpa with 4D masks, or the registered tree-attention kernel),
and through the package's batch-invariant CPU kernels (the CPU default), where speculative
output equals the package's own autoregressive output bit for bit and HF's up to near-ties;
low-precision smoke tests."""

import pytest
import torch

from python_tests.conftest import DEVICES
from python_tests.decoding_helpers import (
    assert_same_or_near_tie,
    hf_greedy,
    tiny_model,
    truncated_copy,
)
from specdec_kernels.decoding import (
    DraftModelDrafter,
    PromptLookupDrafter,
    SelfSpeculativeDrafter,
    generate,
)
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


KERNELS = ["sdpa", "tree-kernel", "cpu-kernels"]


@pytest.fixture(
    scope="module",
    params=[(f, d, k) for f in FAMILIES for d in DEVICES for k in KERNELS
            if d == "cpu" or k != "cpu-kernels"],
    ids=lambda p: "-".join(p),
)
def family_case(request):
    """A tiny model, ragged prompts, the greedy output to expect and the engine's options.
    "sdpa": torch's kernels and 4D masks; "tree-kernel": torch's linears and the registered
    tree-attention kernel; "cpu-kernels": the package's batch-invariant CPU kernels, where
    every drafter must reproduce the package's own autoregressive output exactly."""
    family, device, kernels = request.param
    model = tiny_model(family).to(device)
    prompts = ragged_prompts(model.config.vocab_size, torch.Generator().manual_seed(3))
    hf = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    if kernels == "tree-kernel":
        model.set_attn_implementation(register_tree_attention())
    options = dict(cpu_kernels=kernels == "cpu-kernels")
    expected = hf
    if kernels == "cpu-kernels":
        expected = generate(model, prompts, max_new_tokens=NEW_TOKENS, **options).tokens
        for p, got, want in zip(prompts, expected, hf):
            assert_same_or_near_tie(model, p, got, want, what=f"{family} cpu kernels vs HF")
    return family, device, model, prompts, expected, options


def test_autoregressive_matches_hf_generate(family_case):
    _, _, model, prompts, expected, options = family_case
    out = generate(model, prompts, max_new_tokens=NEW_TOKENS, **options)
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
    family, device, model, prompts, expected, options = family_case
    drafter = drafters(family, model, device)[name]
    out = generate(model, prompts, drafter=drafter, max_new_tokens=NEW_TOKENS, **options)
    assert out.tokens == expected
    for req in out.stats.requests:
        assert req.new_tokens == NEW_TOKENS
        assert 1 <= req.target_forwards <= NEW_TOKENS
    # batch 1 too: one request at a time
    for prompt, want in zip(prompts[:2], expected[:2]):
        single = generate(model, [prompt], drafter=drafter, max_new_tokens=NEW_TOKENS, **options)
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


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_kernels_make_verification_rows_equal_one_token_decoding(family):
    """The premise, bit for bit: with the CPU kernels, the logits of each row of a verified
    block equal the logits of decoding that token alone after the rows before it. (Gemma3's
    sliding-window layers take sdpa, not the invariant kernel, once the context outgrows the
    window; here the window is wider than the context.)"""
    from specdec_kernels.decoding.runner import ModelRunner

    overrides = dict(sliding_window=64) if family == "gemma3" else {}
    model = tiny_model(family, layers=2, **overrides)
    runner = ModelRunner(model, cpu_kernels=True)
    prompt = torch.randint(0, model.config.vocab_size, (23,), generator=torch.Generator().manual_seed(1))
    block = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        verify_cache = runner.new_cache(1, 64)
        runner.append(verify_cache, [prompt.tolist()])
        verified = runner.forward(verify_cache, block, verify_cache.host_lens)[0]
        step_cache = runner.new_cache(1, 64)
        runner.append(step_cache, [prompt.tolist()])
        for j in range(block.shape[1]):
            one = runner.forward(step_cache, block[:, j : j + 1], step_cache.host_lens)[0, 0]
            step_cache.extend([1])
            assert torch.equal(one, verified[j]), j
    runner.release()
