"""Cache integrity: after many speculative steps with rejections (chains and trees, ragged
batches), the engine's KV cache (and a draft model's) equals a fresh prefill of the
committed tokens; lengths on host and device agree."""

import pytest
import torch
from transformers import DynamicCache

from python_tests.conftest import DEVICES
from python_tests.decoding_helpers import tiny_model, truncated_copy
from specdec_kernels.decoding import (
    DraftModelDrafter,
    Engine,
    JacobiDrafter,
    LookaheadDrafter,
    PromptLookupDrafter,
    SelfSpeculativeDrafter,
    StopCriteria,
)
from specdec_kernels.sampling import SamplingParams
from specdec_kernels.models.hf_compat import cache_kwargs

STEPS = 14


@torch.inference_mode()
def fresh_kv(model, tokens):
    """Per-layer (K, V) ``[H, n, D]`` of a plain HF prefill of ``tokens``."""
    cache = DynamicCache()  # no config: full-length layers, sliding ones too
    model(torch.tensor([tokens], device=model.device), use_cache=True, **cache_kwargs(model, cache))
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def assert_cache_matches(model, cache, committed_tokens):
    """Each request's committed rows are a fresh prefill's (to rounding: a bfloat16 draft
    cache, ``narrow_kv``, to bfloat16's; a row out of place is off by far more)."""
    assert cache.lens.tolist() == cache.host_lens
    for b, tokens in enumerate(committed_tokens):
        n = len(tokens)
        assert cache.host_lens[b] == n
        for layer, (k, v) in enumerate(fresh_kv(model, tokens)):
            ours_k, ours_v = cache.layer_kv(layer)
            for ours, fresh in ((ours_k[b, :, :n], k), (ours_v[b, :, :n], v)):
                if ours.dtype == torch.bfloat16:  # each row within rounding of its own
                    rows = (ours.float() - fresh).norm(dim=-1) / fresh.norm(dim=-1)
                    assert rows.max() < 0.03, (layer, rows.max())
                else:
                    torch.testing.assert_close(ours, fresh, rtol=1e-4, atol=1e-5)


def make(name, model):
    if name == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=2, max_depth=4, max_branches=4, max_nodes=10)
    if name == "self-speculative":
        return SelfSpeculativeDrafter(num_layers=1, num_draft=3)
    if name == "draft-model-random":
        other = tiny_model("llama", vocab=16, seed=5).to(model.device)
        return DraftModelDrafter(other, num_draft=3)
    if name == "draft-model-adaptive":
        return DraftModelDrafter(truncated_copy(model, 1), num_draft=2, adaptive=True)
    if name == "lookahead":  # its window rows run in every forward and are never committed
        return LookaheadDrafter(4, 4, 3)
    if name == "jacobi":
        return JacobiDrafter(3)
    raise ValueError(name)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    "name",
    [
        "prompt-lookup", "self-speculative", "draft-model-random", "draft-model-adaptive",
        "lookahead", "jacobi",
    ],
)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("device", DEVICES)
def test_cache_equals_fresh_prefill_after_many_steps(device, family, name, temperature):
    model = tiny_model(family, vocab=16).to(device)  # small vocab: lookups find matches
    prompts = [[1, 2, 3, 1, 2, 3, 4, 1, 2], [5, 6, 5, 6, 7], [9, 1, 9, 1, 9, 1, 2, 3, 4, 5, 9, 1]]
    drafter = make(name, model)
    engine = Engine(model, drafter)
    params = SamplingParams.create(3, temperature=temperature, seed=[1, 2, 3], device=device)
    stop = StopCriteria([1000] * 3, set(), [[]] * 3, None)
    gen = engine.start(prompts, params, stop)
    for _ in range(STEPS):
        engine.step(gen)
    assert not gen.done
    accepted = sum(sum(r.accepted_at) for r in gen.requests)
    rejected = sum(sum(r.proposed_at) for r in gen.requests) - accepted
    assert accepted > 0 and rejected > 0  # both paths of the commit were exercised
    state = gen.state
    assert [len(c) - 1 for c in state.contexts] == state.cache.host_lens
    assert_cache_matches(model, state.cache, [c[:-1] for c in state.contexts])
    if isinstance(drafter, DraftModelDrafter):
        draft_cache = drafter.cache
        committed = [c[:n] for c, n in zip(state.contexts, draft_cache.host_lens)]
        assert all(len(c) - n in (1, 2) for c, n in zip(state.contexts, draft_cache.host_lens))
        assert_cache_matches(drafter.model, draft_cache, committed)


def test_dropping_finished_requests_keeps_the_others_intact():
    model = tiny_model("qwen2", vocab=16)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6], [7, 8, 9]]
    engine = Engine(model, PromptLookupDrafter(max_ngram=2))
    params = SamplingParams.create(3, temperature=0.0)
    stop = StopCriteria([3, 40, 9], set(), [[]] * 3, None)
    gen = engine.start(prompts, params, stop)
    while len(gen.rows) == 3:
        engine.step(gen)
    assert 0 not in gen.rows
    assert gen.state.cache.batch == len(gen.rows)
    assert_cache_matches(model, gen.state.cache, [c[:-1] for c in gen.state.contexts])
    while not gen.done:
        engine.step(gen)
    out = engine.finish(gen)
    assert [len(t) for t in out.tokens] == [3, 40, 9]
