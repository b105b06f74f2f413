"""The EAGLE-3 drafter (issue 24): target features at chosen layers through the doorway, the
training-time test against step-by-step drafting, greedy identity with Hugging Face
``generate`` at batch 1 and 4 (random and shipped drafters), lossless sampling (chi-square,
tiny model), the draft's cache after rejections against a fresh prefill, drafters made for
another target, and checkpoints in the published EAGLE-3 layout."""

import json
import random

import pytest
import torch

from python_tests.decoding_helpers import (
    assert_same_or_near_tie,
    dev_prompts,
    hf_greedy,
    random_eagle,
    tiny_model,
)
from python_tests.test_decoding_sampling import (
    CONFIGS,
    PROMPT,
    VOCAB,
    assert_follows_target,
    exact_distribution,
    run_batch,
)
from specdec_kernels.decoding import generate
from specdec_kernels.decoding.drafter import NoDrafter
from specdec_kernels.decoding.eagle import EagleDrafter, default_eagle_path
from specdec_kernels.eagle.model import (
    EagleConfig,
    EagleDraftModel,
    load_eagle,
    save_eagle,
)
from specdec_kernels.decoding.engine import Engine, StopCriteria
from specdec_kernels.decoding.runner import FeatureSpec
from specdec_kernels.sampling import SamplingParams
from specdec_kernels.training.eagle import ttt_forward

CAPTURE = (0, 1, 2)


def random_draft(target, draft_vocab=None, *, seed=0, std=0.2):
    return random_eagle(target, draft_vocab, seed=seed, std=std, capture=CAPTURE)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", vocab=64, layers=4, seed=1)


# ---------------------------------------------------------------------------- the doorway


def test_feature_spec_captures_layer_outputs_and_all_prompt_rows(tiny):
    seen = {}

    class Reader(NoDrafter):
        target_features = FeatureSpec((1, -1, "final_norm"), prompt_rows="all")

        def start(self, state):
            seen["prefill"] = (state.features.clone(), state.feature_counts.tolist())

        def accept(self, state, outcome):
            seen.setdefault("steps", []).append(state.last_features().clone())

    prompts = [[3, 9, 4, 1, 7], [5, 2]]
    generate(tiny, prompts, drafter=Reader(), max_new_tokens=2, eos_token_id=[])
    features, counts = seen["prefill"]
    assert counts == [4, 1]
    tokens = prompts[0][:-1]
    last = _layer_output(tiny, tokens, 3)
    with torch.no_grad():
        want = torch.cat([_layer_output(tiny, tokens, 1), last, tiny.model.norm(last)], -1)
    torch.testing.assert_close(features[0, :4], want, rtol=1e-4, atol=1e-4)
    assert seen["steps"][0].shape == (2, 3 * tiny.config.hidden_size)


def _layer_output(model, tokens, layer):
    """Output of decoder layer ``layer`` (before the final norm), by a hook."""
    got = {}
    handle = model.model.layers[layer].register_forward_hook(
        lambda m, a, o: got.setdefault("h", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    handle.remove()
    return got["h"][0]


def test_feature_spec_rejects_bad_points(tiny):
    class Odd(NoDrafter):
        target_features = FeatureSpec((0, 9))

    with pytest.raises(ValueError, match="decoder layer 9"):
        generate(tiny, [[1, 2]], drafter=Odd(), max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_rows"):
        FeatureSpec(("final_norm",), prompt_rows="some")


def test_recorder_features_equal_one_forward_over_prompt_and_answer(tiny):
    """The self-distillation data: the states recorded while decoding (prompt rows after the
    prefill, one row per step) are those of one forward over prompt + answer."""
    from specdec_kernels.training.selfdistill import FeatureRecorder

    recorder = FeatureRecorder((1, 3, "final_norm"))
    prompts = [[3, 9, 4, 1, 7], [5, 2, 8]]
    out = generate(tiny, prompts, drafter=recorder, max_new_tokens=6, eos_token_id=[],
                   temperature=[0.0, 1.0], seed=[0, 1])
    for prompt, answer, got in zip(prompts, out.tokens, recorder.per_request()):
        seq = prompt + answer
        last = _layer_output(tiny, seq, 3)
        with torch.no_grad():
            want = torch.cat([_layer_output(tiny, seq, 1), last, tiny.model.norm(last)], -1)
        assert got.shape[0] == len(seq) - 1  # the last token never ran through the target
        torch.testing.assert_close(got.float(), want[:-1].to(torch.bfloat16).float(),
                                   rtol=2e-2, atol=2e-2)


class _CharTokenizer:
    """Enough of a tokenizer for the data builder: no chat template, one id per character."""

    chat_template, eos_token_id = None, None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + ord(c) % 60 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_data_chunk_round_trip(tiny, tmp_path):
    """A chunk of self-distillation data (answers of the frozen target, greedy and sampled,
    with the features recorded on the way) loads back as the trainer reads it."""
    from types import SimpleNamespace

    from specdec_kernels.training.selfdistill import DataCache, generate_chunk

    loaded = SimpleNamespace(model=tiny, tokenizer=_CharTokenizer())
    prompts = ["abc", "hello", "xy"]
    meta = generate_chunk(loaded, prompts, tmp_path / "first" / "chunk_0000.safetensors",
                          layers=(1, 3), max_new_tokens=5, sampled_fraction=0.5, seed=3)
    assert meta["new_tokens"] == 15 and meta["layers"] == [1, 3] and len(meta["answers"]) == 3
    data = DataCache.load(tmp_path)
    assert data.num_sequences == 3 and data.layers == [1, 3]
    lengths = (data.offsets[1:] - data.offsets[:-1]).tolist()
    assert lengths == [len(p) + 5 for p in prompts] and data.prompt_lens.tolist() == [3, 5, 2]
    assert data.features.shape == (sum(lengths), 2 * tiny.config.hidden_size)
    rng = random.Random(3)  # the builder's draw of which answers are sampled
    assert data.sampled.tolist() == [rng.random() < 0.5 for _ in prompts]
    assert 0 < int(data.sampled.sum()) < 3  # greedy and sampled answers both present
    for i, start in enumerate(data.offsets[:-1].tolist()):
        seq = data.tokens[start: start + lengths[i]].tolist()
        prompt_len = int(data.prompt_lens[i])
        if not bool(data.sampled[i]):  # a greedy answer is the target's own
            assert seq[prompt_len:] == generate(tiny, [seq[:prompt_len]], max_new_tokens=5,
                                                eos_token_id=[]).tokens[0]
    # The last token of each sequence never ran through the target: its row is zeros.
    assert not data.features[data.offsets[1] - 1].any() and data.features[data.offsets[1] - 2].any()


# ---------------------------------------------------------------------------- training-time test


@pytest.mark.parametrize("steps", [1, 3])
def test_unrolled_training_matches_step_by_step_drafting(tiny, steps):
    draft = random_draft(tiny, 40, seed=3)
    draft.bind_target(tiny)
    n = 9
    torch.manual_seed(5)
    feats = torch.randn(1, n, 3 * tiny.config.hidden_size)
    tokens = torch.randint(0, 64, (1, n))
    with torch.no_grad():
        unrolled = ttt_forward(draft, feats, tokens, steps)
        nxt = torch.cat([tokens[:, 1:], tokens.new_zeros(1, 1)], 1)
        for k in range(steps):
            for t in range(k, n):
                root = t - k
                pos = torch.arange(root + 1)[None]
                hidden = draft.fuse(feats[:, : root + 1])
                q, keys, values, res = draft.project(hidden, nxt[:, : root + 1], pos)
                mask = torch.ones(1, root + 1, root + 1, dtype=torch.bool).tril()
                out = draft.finish(res, draft.attend(q, keys, values, mask))[:, -1:]
                for j in range(1, k + 1):  # the chain: the draft feeds on its own output
                    p = torch.tensor([[root + j]])
                    q, kj, vj, res = draft.project(out, nxt[:, root + j : root + j + 1], p)
                    keys, values = torch.cat([keys, kj], 2), torch.cat([values, vj], 2)
                    visible = torch.ones(1, 1, keys.shape[2], dtype=torch.bool)
                    out = draft.finish(res, draft.attend(q, keys, values, visible))
                torch.testing.assert_close(unrolled[k][0, t], draft.logits(out)[0, 0],
                                           rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_tiny_greedy_matches_hf_generate_batch_1_and_4(tiny, draft_vocab):
    draft = random_draft(tiny, draft_vocab)
    prompts = [[1, 5, 9, 3, 7], [2, 4], [8, 8, 8, 1, 2, 3, 4, 9], [3]]
    for batch in ([prompts[0]], prompts):
        drafter = EagleDrafter(draft, max_nodes=10, cost_curve={1: 1.0, 64: 1.0})
        out = generate(tiny, batch, drafter=drafter, max_new_tokens=20, eos_token_id=[])
        for p, got in zip(batch, out.tokens):
            assert got == hf_greedy(tiny, p, 20)
        assert out.stats.target_forwards < 20 * len(batch) + 1


def test_draft_that_knows_the_target_is_accepted(tiny):
    """A draft whose head is the target's own (copied into a one-layer draft that passes the
    final layer's features through) still drafts right often enough to be used."""
    draft = random_draft(tiny, None, std=0.0)
    with torch.no_grad():
        draft.lm_head.weight.copy_(tiny.lm_head.weight)
    out = generate(tiny, [PROMPT], drafter=EagleDrafter(draft, max_nodes=8,
                                                        cost_curve={1: 1.0, 64: 1.0}),
                   max_new_tokens=16, eos_token_id=[])
    assert out.tokens[0] == hf_greedy(tiny, PROMPT, 16)


# ---------------------------------------------------------------------------- the draft's cache


def test_draft_cache_after_rejections_equals_a_fresh_prefill(tiny):
    draft = random_draft(tiny, 40, seed=2)
    engine = Engine(tiny, EagleDrafter(draft, max_nodes=10, cost_curve={1: 1.0, 64: 1.0}),
                    cpu_kernels=False)
    params = SamplingParams.create(1, device="cpu")
    stop = StopCriteria([30], set(), [[]], None)
    gen = engine.start([[1, 5, 9, 3, 7, 2]], params, stop)
    for _ in range(6):
        engine.step(gen)
    rejected = sum(len(t) for t in engine.drafter._trees) > 0
    assert rejected and gen.stats.target_forwards == 6
    drafter = engine.drafter
    with torch.inference_mode():
        drafter.propose(gen.state)  # commits the last accepted rows
    context = gen.state.contexts[0]
    fresh_engine = Engine(tiny, EagleDrafter(draft, max_nodes=10, cost_curve={1: 1.0, 64: 1.0}),
                          cpu_kernels=False)
    fresh = fresh_engine.start([context], params, StopCriteria([4], set(), [[]], None))
    with torch.inference_mode():
        fresh_engine.drafter.propose(fresh.state)
    n = drafter.lens[0]
    assert n == fresh_engine.drafter.lens[0] == len(context) - 1
    torch.testing.assert_close(drafter.keys[:, :, :n], fresh_engine.drafter.keys[:, :, :n],
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(drafter.values[:, :, :n], fresh_engine.drafter.values[:, :, :n],
                               rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- sampling


def test_sampling_follows_the_target_distribution():
    target = tiny_model("llama", vocab=VOCAB, layers=3, seed=11)
    exact = [exact_distribution(target, c) for c in CONFIGS]
    draft = random_draft(target, None, seed=4, std=0.3)
    drafter = EagleDrafter(draft, branching=2, max_depth=3, max_nodes=6,
                           cost_curve={1: 1.0, 64: 1.0})
    out = run_batch(target, drafter)
    assert_follows_target(out, exact)
    assert out.stats.tau > 1.05


@pytest.mark.parametrize("k", [2, 3])
def test_sampled_siblings_are_sequential_draws_without_replacement(tiny, k):
    """Sibling ``r`` is a draw from the row less siblings ``0..r-1``, renormalised: first
    draws follow ``q``, second draws given the first follow ``q`` without it, and no row
    repeats a token (what verification is told each sibling was drawn from)."""
    drafter = EagleDrafter(random_draft(tiny), branching=k)
    drafter._generator = torch.Generator().manual_seed(5)
    vd = drafter.draft.draft_ids.numel()
    logits = torch.full((vd,), -30.0)
    logits[:5] = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5])  # 5 likely tokens, the rest ~0
    n = 40000
    _, q, rows, draws = drafter._children(logits.expand(n, vd), True, torch.ones(1))
    p = rows[0, :5].double()
    assert all(len(set(row)) == k for row in draws.tolist())
    assert torch.equal(q[:, 0], rows[0][draws[:, 0]])
    first = torch.bincount(draws[:, 0], minlength=vd)[:5].double() / n
    assert torch.allclose(first, p, atol=0.01), (first, p)
    given = draws[draws[:, 0] == 0, 1]  # second draws after token 0 came first
    second = torch.bincount(given, minlength=vd)[:5].double() / len(given)
    want = torch.cat([p.new_zeros(1), p[1:] / (1 - p[0])])
    assert torch.allclose(second, want, atol=0.015), (second, want)


# ---------------------------------------------------------------------------- files and checks


def test_draft_network_runs_on_the_runners_linear_kernels(tiny, monkeypatch):
    """The draft layer's linears take the target's CPU kernels (the runner's ``linears()``),
    not torch's GEMM, when the runner uses the package's kernels; torch's when it does not."""
    import contextlib

    from specdec_kernels import ops
    from specdec_kernels.decoding.cpu_matmul import KernelWeight
    from specdec_kernels.decoding.runner import ModelRunner

    weights = []
    real = ops.small_batch_linear
    monkeypatch.setattr(ops, "small_batch_linear",
                        lambda x, w, b=None: weights.append(w.data_ptr()) or real(x, w, b))
    drafter = EagleDrafter(random_draft(tiny), draft_dtype="float32")
    out = generate(tiny, [[1, 2, 3]], drafter=drafter, max_new_tokens=6, eos_token_id=[])
    draft, layer = drafter.draft, drafter.draft.midlayer
    alone = {m.weight.data_ptr() for m in (draft.fc, layer.self_attn.o_proj,
                                          layer.mlp.down_proj, draft.lm_head)}
    joined = {drafter._layer.qkv._joined.data_ptr(), drafter._layer.gate_up._joined.data_ptr()}
    assert alone | joined <= set(weights)  # fc, q/k/v joined, o, gate/up joined, down, head
    assert out.tokens == generate(tiny, [[1, 2, 3]], max_new_tokens=6, eos_token_id=[]).tokens
    routed = ModelRunner(tiny, cpu_kernels=True).linears(drafter.draft)
    with routed():
        assert all(isinstance(m.weight, KernelWeight) for m in drafter.draft.modules()
                   if isinstance(m, torch.nn.Linear))
    assert ModelRunner(tiny, cpu_kernels=False).linears(drafter.draft) is contextlib.nullcontext


@pytest.mark.parametrize("batch,rows", [(1, 1), (1, 5), (2, 3), (3, 8)])
@pytest.mark.parametrize("kernels", [True, False])
def test_fast_draft_layer_gives_the_models_bits(tiny, batch, rows, kernels):
    """The drafter's forward pieces (joined q/k/v and gate/up, the decoder-layer ops) against
    the model's own: the same bits on the package's kernels (each joined column is its own
    linear's), equal within rounding on torch's; a weight changed in place is seen."""
    from specdec_kernels.decoding.eagle import _FastDraftLayer
    from specdec_kernels.decoding.runner import ModelRunner

    draft = random_draft(tiny, seed=batch + rows).eval()
    draft.bind_target(tiny)
    fast = _FastDraftLayer(draft)
    assert _FastDraftLayer.fits(draft)
    gen = torch.Generator().manual_seed(rows)
    c = draft.config
    hidden = torch.randn(batch, rows, c.hidden_size, generator=gen)
    tokens = torch.randint(0, c.vocab_size, (batch, rows), generator=gen)
    positions = torch.randint(0, 300, (batch, 1), generator=gen) + torch.arange(rows)
    if rows == 3:
        positions = positions[:, :1]  # a block of siblings: one depth, one position
    attended = torch.randn(batch, c.num_heads, rows, c.head_dim, generator=gen)
    routed = ModelRunner(tiny, cpu_kernels=kernels).linears(draft)

    def check():
        with torch.inference_mode(), routed():
            pairs = list(zip(draft.project(hidden, tokens, positions),
                             fast.project(hidden, tokens, positions)))
            pairs.append((draft.finish(hidden, attended), fast.finish(hidden, attended)))
            pairs.append((draft.logits(hidden), fast.logits(hidden)))
        for want, got in pairs:
            assert got.shape == want.shape
            if kernels:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    check()
    with torch.no_grad():
        draft.midlayer.self_attn.k_proj.weight.mul_(-0.5)
        draft.midlayer.mlp.up_proj.weight.add_(0.01)
    check()


def test_bfloat16_draft_keeps_the_output_and_the_callers_network(tiny):
    """A bfloat16 draft network changes which tokens are drafted, never the output (greedy,
    ragged batch); the caller's float32 network is left as it was; other dtypes are refused."""
    draft = random_draft(tiny)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    prompts = [PROMPT, [5, 2, 9]]
    drafter = EagleDrafter(draft, draft_dtype="bfloat16", max_nodes=8,
                           cost_curve={1: 1.0, 64: 1.0})
    out = generate(tiny, prompts, drafter=drafter, max_new_tokens=10, eos_token_id=[])
    assert out.tokens == generate(tiny, prompts, max_new_tokens=10, eos_token_id=[]).tokens
    assert drafter.draft.fc.weight.dtype == torch.bfloat16
    assert drafter.describe()["draft_dtype"] == "bfloat16"
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    with pytest.raises(ValueError, match="draft_dtype must be auto, float32, bfloat16 or int8"):
        EagleDrafter(draft, draft_dtype="float16")


def test_int8_draft_keeps_the_output_and_the_callers_network(tiny):
    """An int8 draft (weights through quantized_linear, q/k/v and gate/up still one call
    each) changes which tokens are drafted, never the output (greedy, ragged batch); it drafts
    as the float32 network does on most steps; the caller's network is left as it was."""
    from specdec_kernels.models.quantized_weight import QuantizedWeight

    draft = random_draft(tiny)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    prompts = [PROMPT, [5, 2, 9]]
    kwargs = dict(max_nodes=8, cost_curve={1: 1.0, 64: 1.0})
    drafter = EagleDrafter(draft, draft_dtype="int8", **kwargs)
    out = generate(tiny, prompts, drafter=drafter, max_new_tokens=10, eos_token_id=[])
    assert out.tokens == generate(tiny, prompts, max_new_tokens=10, eos_token_id=[]).tokens
    layer = drafter.draft.midlayer
    for linear in (drafter.draft.fc, layer.self_attn.q_proj, layer.mlp.down_proj):
        assert isinstance(linear.weight, QuantizedWeight)
    assert drafter._layer.qkv._joined is not None  # laid out together: one call
    assert drafter.describe()["draft_dtype"] == "int8"
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    full = generate(tiny, prompts, drafter=EagleDrafter(draft, **kwargs), max_new_tokens=10,
                    eos_token_id=[])
    assert abs(out.stats.tau - full.stats.tau) < 0.5 * full.stats.tau


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_auto_draft_dtype_is_int8_on_the_package_cpu_kernels_only(tiny, cpu_kernels):
    """The default draft dtype: int8 weights where the target runs the package's CPU kernels
    (where it measured faster), float32 otherwise; the caller's network keeps its float32
    weights either way, and the output is the plain loop's."""
    from specdec_kernels.models.quantized_weight import QuantizedWeight

    draft = random_draft(tiny)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    drafter = EagleDrafter(draft, max_nodes=8, cost_curve={1: 1.0, 64: 1.0})
    prompts = [PROMPT, [5, 2, 9]]
    out = generate(tiny, prompts, drafter=drafter, max_new_tokens=10, eos_token_id=[],
                   cpu_kernels=cpu_kernels)
    plain = generate(tiny, prompts, max_new_tokens=10, eos_token_id=[], cpu_kernels=cpu_kernels)
    assert out.tokens == plain.tokens
    assert isinstance(drafter.draft.fc.weight, QuantizedWeight) == cpu_kernels
    assert drafter.describe()["draft_dtype"] == ("int8" if cpu_kernels else "float32")
    assert all(torch.equal(v, before[k]) for k, v in draft.state_dict().items())
    assert not isinstance(draft.fc.weight, QuantizedWeight)


def test_a_depth_is_expanded_only_when_it_pays_for_itself(tiny):
    """The next depth's ``top_k`` best paths, each worth its probability times a one-token
    step less one node's verification, must beat the measured cost of an expansion."""
    drafter = EagleDrafter(random_draft(tiny), branching=2)
    drafter._prior_step_ms, drafter._node_ms = 20.0, 0.5
    paths = lambda *rows: torch.tensor(rows).log()  # noqa: E731
    drafter._expand_ms = None  # nothing measured yet: expand
    assert drafter._worth_expanding(paths([0.01, 0.01]))
    drafter._expand_ms = 3.0
    assert not drafter._worth_expanding(paths([0.09, 0.09, 0.05]))  # top 2: 2 x 1.3 = 2.6
    assert drafter._worth_expanding(paths([0.11, 0.11, 0.0]))  # 2 x 1.7 = 3.4
    assert not drafter._worth_expanding(paths([0.15, 0.02, 0.02]))  # 2.5 + 0 (not -0.1)
    # A batch expands when one of its requests gains enough.
    assert drafter._worth_expanding(paths([0.15, 0.02, 0.02], [0.2, 0.0, 0.0]))


def test_report_counts_forwards_and_nodes_per_step(tiny):
    """The drafter reports its draft forwards (the catch-up's included) and drafted nodes per
    step over its life, and the projection's draft cost uses the measured forwards."""
    drafter = EagleDrafter(random_draft(tiny), max_nodes=8, cost_curve={1: 1.0, 64: 1.0})
    assert drafter.report()["draft_forwards_per_step"] is None
    out = generate(tiny, [PROMPT], drafter=drafter, max_new_tokens=6, eos_token_id=[])
    report = drafter.report()
    steps = out.stats.target_forwards
    forwards = report["draft_forwards_per_step"]
    assert 1.0 <= forwards <= drafter.max_depth
    assert 0.0 <= report["tree_nodes_per_step"] <= 8
    assert drafter._counts["draft_forwards"] >= drafter._counts["proposals"] == steps
    assert out.stats.drafter == drafter.describe()  # the run's settings, stated at its end
    described = drafter.describe()["head_cost_fraction"]
    assert described == pytest.approx(forwards * drafter._forward_fraction, abs=1e-5)
    generate(tiny, [PROMPT], drafter=drafter, max_new_tokens=6, eos_token_id=[])
    assert drafter._counts["proposals"] > steps  # counts carry over the drafter's runs


def test_eagle_from_a_folder_is_a_prophet_of_multi(tiny, tmp_path):
    """A drafter learns its capture points when bound (EAGLE from its files): the merged
    drafter asks for them then, drafts with EAGLE among its prophets, keeps the greedy output
    (ragged batch), and merges prophets that want different features once it knows."""
    from specdec_kernels.decoding.multi import MultiDrafter
    from specdec_kernels.decoding.prompt_lookup import PromptLookupDrafter

    folder = save_eagle(random_draft(tiny), tmp_path / "draft")
    flat = {1: 1.0, 64: 1.0}
    eagle = EagleDrafter(folder, max_nodes=8, cost_curve=flat)
    assert eagle.target_features is None  # not known before its files are read
    multi = MultiDrafter([PromptLookupDrafter(), eagle], cost_curve=flat, max_nodes=12)
    prompts = [PROMPT, [5, 2, 9, 5, 2, 9]]
    out = generate(tiny, prompts, drafter=multi, max_new_tokens=10, eos_token_id=[])
    assert out.tokens == generate(tiny, prompts, max_new_tokens=10, eos_token_id=[]).tokens
    assert multi.target_features == FeatureSpec(CAPTURE, prompt_rows="all")
    assert out.stats.drafter_report["prophets"]["eagle"]["nodes_proposed"] > 0
    other = EagleDrafter(random_eagle(tiny, capture=(1, 2, 3)), cost_curve=flat)
    both = MultiDrafter([EagleDrafter(folder, cost_curve=flat), other], cost_curve=flat)
    out = generate(tiny, prompts, drafter=both, max_new_tokens=10, eos_token_id=[])
    assert out.tokens == generate(tiny, prompts, max_new_tokens=10, eos_token_id=[]).tokens
    assert both.target_features == FeatureSpec((0, 1, 2, 3), prompt_rows="all")


def _medusa_and_eagle(tiny, flat):
    from specdec_kernels.decoding.medusa import MedusaDrafter
    from specdec_kernels.decoding.multi import MultiDrafter
    from python_tests.decoding_helpers import random_heads

    hidden = tiny.config.hidden_size
    medusa = MedusaDrafter(random_heads(hidden, tiny.config.vocab_size, 2, 1, seed=3),
                           tree=[(0,), (1,), (0, 0)])
    eagle = EagleDrafter(random_eagle(tiny, capture=(2, 3, 0)), max_nodes=6, cost_curve=flat)
    return MultiDrafter([medusa, eagle], cost_curve=flat, max_nodes=10)


def test_medusa_and_eagle_prophets_read_their_own_features(tiny):
    """Medusa (the final norm, the last prompt row) and EAGLE (three decoder layers, every
    prompt row) in one merged drafter: the engine captures the union, once, and each prophet
    is handed its own points' columns in its own order; Medusa the last valid prompt row
    only until the first step's rows arrive."""
    from specdec_kernels.decoding.drafter import DecodeState
    from specdec_kernels.decoding.runner import ModelRunner

    multi = _medusa_and_eagle(tiny, {1: 1.0, 64: 1.0})
    multi.bind(ModelRunner(tiny), None)
    assert multi.target_features == FeatureSpec(("final_norm", 2, 3, 0), prompt_rows="all")
    batch, rows, hidden = 2, 5, tiny.config.hidden_size
    merged = torch.randn(batch, rows, 4, hidden)
    counts = torch.tensor([5, 3])
    state = DecodeState(None, None, [[1], [2]], torch.tensor([1, 2]), None, None,
                        torch.zeros(2), True, [4, 4], merged.flatten(-2), counts)
    multi._prompt_features = True
    medusa, eagle = multi._view(0, state), multi._view(1, state)
    assert torch.equal(medusa.features, merged[[0, 1], [4, 2], None, 0])
    assert medusa.feature_counts.tolist() == [1, 1]
    assert torch.equal(eagle.features, merged[:, :, 1:].flatten(-2))
    assert eagle.feature_counts is counts
    multi._prompt_features = False  # a step's accepted rows: every prophet sees them all
    assert torch.equal(multi._view(0, state).features, merged[:, :, 0])
    assert multi._view(0, state).feature_counts is counts


def test_medusa_and_eagle_merged_keep_the_greedy_output(tiny):
    """Greedy output of the merged Medusa + EAGLE drafter is the plain loop's (ragged batch),
    and both prophets' nodes are verified."""
    multi = _medusa_and_eagle(tiny, {1: 1.0, 64: 1.0})
    prompts = [PROMPT, [5, 2, 9, 5, 2, 9], [7]]
    out = generate(tiny, prompts, drafter=multi, max_new_tokens=12, eos_token_id=[])
    assert out.tokens == generate(tiny, prompts, max_new_tokens=12, eos_token_id=[]).tokens
    prophets = out.stats.drafter_report["prophets"]
    assert prophets["medusa"]["nodes_verified"] > 0 and prophets["eagle"]["nodes_verified"] > 0


def test_fast_draft_layer_leaves_other_networks_alone(tiny):
    """EAGLE-1's network computes its own pieces: the drafter keeps the model's methods."""
    from specdec_kernels.decoding.eagle import _FastDraftLayer
    from specdec_kernels.eagle.model import Eagle1DraftModel

    draft = random_draft(tiny)
    assert _FastDraftLayer.fits(draft)
    config = EagleConfig.from_json(draft.config.to_json())
    assert not _FastDraftLayer.fits(Eagle1DraftModel(config))


def test_drafter_for_another_target_is_refused(tiny):
    other = tiny_model("llama", vocab=64, layers=4, seed=1, hidden_size=48)
    with pytest.raises(ValueError, match="hidden size"):
        generate(tiny, [[1, 2, 3]], drafter=EagleDrafter(random_draft(other)), max_new_tokens=2)
    bigger = tiny_model("llama", vocab=80, layers=4, seed=1)
    with pytest.raises(ValueError, match="vocabulary of 80"):
        generate(tiny, [[1, 2, 3]], drafter=EagleDrafter(random_draft(bigger)), max_new_tokens=2)
    deep = EagleDraftModel(EagleConfig.for_target(tiny.config, 64, (0, 1, 7)))
    with pytest.raises(ValueError, match="reads target layers"):
        generate(tiny, [[1, 2, 3]], drafter=EagleDrafter(deep), max_new_tokens=2)


def test_round_trip_through_our_files(tiny, tmp_path):
    draft = random_draft(tiny, 40, seed=6)
    save_eagle(draft, tmp_path / "d")
    loaded = load_eagle(tmp_path / "d")
    assert torch.equal(loaded.draft_ids, draft.draft_ids)
    for name, value in draft.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value.to(torch.bfloat16).float())


@pytest.mark.parametrize("layout", ["midlayer-safetensors", "layers0-bin-with-embedding"])
def test_published_checkpoint_loads_and_drafts(tiny, tmp_path, layout):
    """A checkpoint written the way the EAGLE repository / SpecForge publish them: a Llama
    config with draft_vocab_size and no aux layer ids (the defaults 2, L/2, L-3 apply), weights
    named midlayer.* (or layers.0.*) with d2t offsets and a t2d mask."""
    layers = tiny.config.num_hidden_layers
    default_points = (1, layers // 2 - 1, layers - 4)
    draft = EagleDraftModel(EagleConfig.for_target(tiny.config, 40, default_points),
                            torch.randperm(64)[:40].sort().values)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.2)
    weights = {k: v.clone() for k, v in draft.state_dict().items()}
    weights["d2t"] = draft.draft_ids - torch.arange(40)
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[draft.draft_ids] = True
    weights["t2d"] = t2d
    if layout.startswith("layers0"):
        weights = {k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
        weights["embed_tokens.weight"] = tiny.get_input_embeddings().weight.detach().clone()
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 32,
        "num_attention_heads": tiny.config.num_attention_heads,
        "num_key_value_heads": tiny.config.num_key_value_heads,
        "intermediate_size": tiny.config.intermediate_size, "num_hidden_layers": 1,
        "rms_norm_eps": tiny.config.rms_norm_eps, "vocab_size": 64, "draft_vocab_size": 40,
        "rope_theta": draft.config.rope_theta, "hidden_act": "silu",
    }
    folder = tmp_path / layout
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if layout.endswith("safetensors"):
        from safetensors.torch import save_file

        save_file(weights, str(folder / "model.safetensors"))
    else:
        torch.save(weights, str(folder / "pytorch_model.bin"))
    drafter = EagleDrafter(str(folder), max_nodes=8, draft_dtype="float32",
                           cost_curve={1: 1.0, 64: 1.0})
    out = generate(tiny, [PROMPT], drafter=drafter, max_new_tokens=12, eos_token_id=[])
    assert out.tokens[0] == hf_greedy(tiny, PROMPT, 12)
    assert drafter.draft.config.capture_layers == default_points
    assert torch.equal(drafter.draft.draft_ids, draft.draft_ids)
    # The same network as the one written: identical draft logits.
    x = torch.randn(1, 3, 32)
    torch.testing.assert_close(drafter.draft.logits(x), draft.logits(x))


def test_published_eagle1_checkpoint_loads_and_drafts(tiny, tmp_path):
    """An EAGLE-1/2 checkpoint (fc over [embedding, final-norm state] with bias, layers.0.*
    without an input norm, the target's LM head): loads, drafts, keeps greedy identity."""
    from specdec_kernels.eagle.model import Eagle1DraftModel, _eagle1_config

    config = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 8, "intermediate_size": 64, "vocab_size": 64,
              "rms_norm_eps": tiny.config.rms_norm_eps, "rope_theta": 10000.0, "bias": True}
    torch.manual_seed(8)
    draft = Eagle1DraftModel(_eagle1_config(config))
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.2)
    weights = {k.replace("midlayer.", "layers.0."): v for k, v in draft.state_dict().items()}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(weights, str(tmp_path / "pytorch_model.bin"))
    drafter = EagleDrafter(str(tmp_path), max_nodes=8, cost_curve={1: 1.0, 64: 1.0})
    out = generate(tiny, [PROMPT], drafter=drafter, max_new_tokens=12, eos_token_id=[])
    assert out.tokens[0] == hf_greedy(tiny, PROMPT, 12)
    assert drafter.target_features == FeatureSpec(("final_norm",), prompt_rows="all")
    draft.bind_target(tiny)
    x = torch.randn(1, 3, 32)
    torch.testing.assert_close(drafter.draft.logits(x), draft.logits(x))


def test_bad_published_checkpoints_are_refused(tiny, tmp_path):
    draft = random_draft(tiny, 40)
    save_eagle(draft, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["draft_vocab_size"] = 41
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="d2t has shape"):
        load_eagle(tmp_path / "d")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_eagle(tmp_path / "missing")



@pytest.mark.parametrize("damage", ["truncated safetensors", "pickle payload"])
def test_damaged_or_planted_eagle_weights_are_refused(tiny, tmp_path, damage):
    """EAGLE checkpoints go through the same safe readers as Medusa heads: a damaged
    safetensors file or a ``pytorch_model.bin`` with a payload is a ValueError naming the file,
    and the payload never runs."""
    folder = tmp_path / "d"
    save_eagle(random_draft(tiny, 40), folder)
    weights = folder / "model.safetensors"
    marker = tmp_path / "payload-ran"
    if damage == "truncated safetensors":
        weights.write_bytes(weights.read_bytes()[:100])
        match = "model.safetensors is not a readable safetensors file"
    else:
        from python_tests.test_loader_safety import Payload

        weights.unlink()
        torch.save({"fc.weight": Payload(marker)}, folder / "pytorch_model.bin")
        match = "pytorch_model.bin is not a plain tensor checkpoint; it is refused, never executed"
    with pytest.raises(ValueError, match=match):
        load_eagle(folder)
    assert not marker.exists()


# ---------------------------------------------------------------------------- shipped drafter

NEW_TOKENS = 24


@pytest.mark.default_model
def test_shipped_drafter_greedy_identity_batch_1_and_4(loaded):
    from specdec_kernels.models import encode_prompts

    assert (default_eagle_path() / "config.json").is_file()
    prompts = encode_prompts(loaded.tokenizer, dev_prompts()[:4])
    want = [generate(loaded, [p], max_new_tokens=NEW_TOKENS).tokens[0] for p in prompts]
    forwards = emitted = 0
    for p, w in zip(prompts, want):
        out = generate(loaded, [p], drafter="eagle", max_new_tokens=NEW_TOKENS)
        assert out.tokens[0] == w
        assert_same_or_near_tie(loaded.model, p, out.tokens[0],
                                hf_greedy(loaded.model, p, NEW_TOKENS),
                                what="eagle vs HF generate")
        forwards += out.stats.target_forwards
        emitted += out.stats.new_tokens
    assert emitted / forwards > 1.2  # a random draft gets about 1.05
    out = generate(loaded, prompts, drafter="eagle", max_new_tokens=NEW_TOKENS)
    assert out.tokens == want


@pytest.mark.default_model
def test_cli_generate_with_eagle_and_a_bad_option(capsys, loaded):
    from specdec_kernels import cli

    assert cli.main(["generate", "--drafter", "eagle", "--branching", "4", "--max-new-tokens",
                     "6", "--json", "Count: one two three, one two three,"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["method"] == "eagle" and len(out["tokens"][0]) == 6
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "--drafter", "medusa", "--branching", "4", "hi"])
    assert exit_.value.code == 2
    assert "--branching does not apply" in capsys.readouterr().err


def test_cli_lists_train_eagle(capsys):
    from specdec_kernels import cli

    with pytest.raises(SystemExit):
        cli.main(["train", "eagle", "--help"])
    text = capsys.readouterr().out
    assert "--draft-vocab" in text and "--steps" in text and "--time-budget" in text
