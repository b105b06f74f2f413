"""Prompts against the model's context (``max_position_embeddings``): a request that does not
fit is refused unless truncation is asked for; long prompts prefill in chunks, with progress,
and decode exactly as in one forward."""

import pytest
import torch

from python_tests.decoding_helpers import hf_greedy, tiny_model, truncated_copy
from specdec_kernels.decoding import (
    DraftModelDrafter,
    PromptLookupDrafter,
    SelfSpeculativeDrafter,
    generate,
    runner,
)
from specdec_kernels.decoding.api import fit_context

CONTEXT = 24


@pytest.fixture(scope="module")
def small_context_model():
    return tiny_model("llama", vocab=40, max_position_embeddings=CONTEXT)


def _prompt(length: int, seed: int = 0) -> list:
    return torch.randint(0, 40, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("length, new", [(20, 5), (24, 1), (2, 23), (30, 3)])
def test_a_request_beyond_the_context_is_refused(small_context_model, length, new):
    message = rf"prompt 0 has {length} tokens; with max_new_tokens={new} that is {length + new}"
    with pytest.raises(ValueError, match=message) as error:
        generate(small_context_model, [_prompt(length)], max_new_tokens=new)
    assert f"context of {CONTEXT} tokens (max_position_embeddings)" in str(error.value)
    assert f"keep its last {CONTEXT - new} tokens" in str(error.value)


def test_the_request_that_does_not_fit_is_named(small_context_model):
    prompts = [_prompt(10), _prompt(20, seed=1)]
    with pytest.raises(ValueError, match="prompt 1 has 20 tokens"):
        generate(small_context_model, prompts, max_new_tokens=[14, 5])
    # Exactly full is fine: the last new token is never fed back to the model.
    out = generate(small_context_model, prompts, max_new_tokens=[14, 4], eos_token_id=[])
    assert [len(t) for t in out.tokens] == [14, 4]


@pytest.mark.parametrize("drafter", [None, "prompt-lookup"])
def test_truncate_prompt_keeps_the_last_tokens(small_context_model, drafter):
    prompt, new = _prompt(30), 6
    out = generate(
        small_context_model, [prompt], max_new_tokens=new, truncate_prompt=True,
        drafter=drafter, eos_token_id=[],
    )
    kept = prompt[-(CONTEXT - new) :]
    assert out.prompt_tokens == [kept]
    assert out.tokens == [hf_greedy(small_context_model, kept, new)]
    assert out.stats.requests[0].prompt_tokens == CONTEXT - new


def test_truncation_cannot_make_room_for_max_new_tokens(small_context_model):
    with pytest.raises(ValueError, match="max_new_tokens=24 .* leaves no room for a prompt"):
        generate(small_context_model, [[1, 2]], max_new_tokens=CONTEXT, truncate_prompt=True)


def test_fit_context_leaves_fitting_prompts_alone():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    assert fit_context(prompts, [2, 2], 7, truncate=False) == prompts
    assert fit_context(prompts, [2, 4], 7, truncate=True) == [[1, 2, 3], [6, 7, 8]]


# --------------------------------------------------------------------- chunked prefill


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=64, layers=4)


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_prefill_in_chunks_reports_progress(model, monkeypatch, chunk):
    monkeypatch.setattr(runner, "PREFILL_CHUNK_TOKENS", chunk)
    prompts = [_prompt(45), _prompt(23, seed=1)]
    calls = []
    out = generate(
        model, prompts, max_new_tokens=5, eos_token_id=[],
        prefill_progress=lambda done, total: calls.append((done, total)),
    )
    # Everything but each prompt's last token is prefilled.
    total, longest = 44 + 22, 44
    if chunk >= longest:
        assert calls == []
    else:
        chunks = -(-longest // chunk)
        assert len(calls) == chunks + 1
        assert calls[0] == (0, total) and calls[-1] == (total, total)
        assert all(a[0] < b[0] for a, b in zip(calls, calls[1:]))
        assert all(t == total for _, t in calls)
    assert out.tokens == [hf_greedy(model, p, 5) for p in prompts]


@pytest.mark.parametrize(
    "make_drafter",
    [
        lambda model: PromptLookupDrafter(),
        lambda model: SelfSpeculativeDrafter(2, num_draft=3),
        lambda model: DraftModelDrafter(truncated_copy(model, 2), num_draft=3),
    ],
    ids=["prompt-lookup", "self-speculative", "draft-model"],
)
def test_chunked_prefill_decodes_like_one_forward(model, monkeypatch, make_drafter):
    # Repetitive prompts, so that the drafters' proposals get accepted.
    prompts = [(_prompt(12) * 5)[:57], _prompt(30, seed=2)]
    whole = generate(model, prompts, drafter=make_drafter(model), max_new_tokens=12,
                     eos_token_id=[])
    monkeypatch.setattr(runner, "PREFILL_CHUNK_TOKENS", 9)
    chunked = generate(model, prompts, drafter=make_drafter(model), max_new_tokens=12,
                       eos_token_id=[])
    assert chunked.tokens == whole.tokens == [hf_greedy(model, p, 12) for p in prompts]


def test_prefill_chunk_size_must_be_positive(model):
    r = runner.ModelRunner(model)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        r.prefill(r.new_cache(1, 8), [[1, 2, 3]], chunk_size=0)
