"""The direct forward of Llama-family decoders (``models/direct_forward.py``, on the
decoder-layer ops) against the model's own forward through the same kernels: every logit,
every cached K/V row and every captured feature bit-identical, for prefill, chains, trees,
ragged batches, extra rows, early exit and last-row logits (norm weights randomised, so a
swapped norm shows); its rows bit-identical whether verified in a block or decoded one at a
time; other architectures (and sliding windows that cut the rows) are left to the model's
forward."""

import pytest
import torch

from python_tests.decoding_helpers import randomise_norms, tiny_model
from specdec_kernels.decoding.drafter import ExtraRows
from specdec_kernels.decoding.runner import FeatureSpec, ModelRunner
from specdec_kernels.models.direct_forward import DirectForward, unsupported_reason
from specdec_kernels.models.quantized_weight import joined_rows, quantize_model

FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]
DTYPES = [torch.float32, torch.bfloat16]


def runners(model):
    """The same model behind a direct runner and one that calls the model (CPU kernels both)."""
    return ModelRunner(model, cpu_kernels=True), ModelRunner(model, cpu_kernels=True,
                                                             direct_forward=False)


def prompts(vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (7, 13)]


def assert_equal(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a, b), (a - b).abs().max()


@pytest.fixture(scope="module",
                params=[(f, d) for f in FAMILIES for d in DTYPES] + [("llama", "int4")],
                ids=lambda p: f"{p[0]}-{str(p[1]).replace('torch.', '')}")
def model(request):
    """A tiny model per family and dtype, and one with int4 weights (the file-precision kind:
    weights held as buffers, run by the quantized kernel)."""
    family, dtype = request.param
    model = _model(family, dtype)
    return randomise_norms(model)


def _model(family, dtype):
    if dtype == "int4":
        model = tiny_model(family, vocab=61, layers=3, attention_bias=True)
        model = quantize_model(model, bits=4, group=32)
        assert joined_rows([model.model.layers[0].self_attn.q_proj.weight,
                            model.model.layers[0].self_attn.k_proj.weight,
                            model.model.layers[0].self_attn.v_proj.weight]) is not None
        return model
    return tiny_model(family, vocab=61, layers=3, dtype=dtype, attention_bias=family == "llama")


@torch.inference_mode()
def test_every_block_kind_matches_the_models_own_forward(model):
    direct, own = runners(model)
    caches = [r.new_cache(2, 64) for r in (direct, own)]
    # Ragged prefill (right-padded block), features of every prompt row.
    spec = FeatureSpec((0, -1, "final_norm"), prompt_rows="all")
    got = [r.prefill(c, prompts(61), want_features=spec) for r, c in zip((direct, own), caches)]
    assert direct._direct and own._direct is None
    assert_equal(*got)
    assert_equal(caches[0].buffer, caches[1].buffer)
    starts = list(caches[0].host_lens)
    assert starts[0] != starts[1]
    tokens = torch.tensor([[3, 5, 7, 11, 13], [17, 19, 23, 29, 31]])
    tree = torch.tensor([[-1, 0, 0, 1, -2], [-1, 0, 1, 2, 3]])
    outs = [r.forward(c, tokens, starts, tree, features=True) for r, c in zip((direct, own), caches)]
    assert_equal(outs[0][0], outs[1][0])
    assert_equal(outs[0][1], outs[1][1])
    assert_equal(caches[0].buffer, caches[1].buffer)
    # A chain with two extra rows after it (lookahead-style), own positions and masks.
    extra = ExtraRows(
        tokens=torch.tensor([[8, 10], [7, 9]]),
        positions=torch.tensor([[1, 2], [2, 3]]),
        mask=torch.tensor([[[0b01001], [0b11001]], [[0b01011], [0b11011]]], dtype=torch.int32),
    )
    tokens = torch.tensor([[2, 4, 6, 8, 10], [1, 3, 5, 7, 9]])  # 3 chain rows, 2 extra
    outs = [r.forward(c, tokens, starts, extra=extra) for r, c in zip((direct, own), caches)]
    assert_equal(*outs)
    # Early exit (a layer-skip draft) and last-row logits of a prefill-style block.
    for last in (False, True):
        outs = [r.forward(c, tokens[:, :3], starts, exit_layer=2, last_logits_only=last)
                for r, c in zip((direct, own), caches)]
        assert_equal(*outs)
        outs = [r.forward(c, tokens[:, :3], starts, last_logits_only=last, prefill=True)
                for r, c in zip((direct, own), caches)]
        assert_equal(*outs)


@torch.inference_mode()
def test_a_replaced_weight_is_seen():
    model = tiny_model("llama", vocab=61)
    direct, own = runners(model)
    caches = [r.new_cache(1, 32) for r in (direct, own)]
    for r, c in zip((direct, own), caches):
        r.prefill(c, prompts(61)[:1])
    before = direct.forward(caches[0], torch.tensor([[5]]), caches[0].host_lens)
    layer = model.model.layers[1].mlp.down_proj
    layer.weight = torch.nn.Parameter(layer.weight * 1.5, requires_grad=False)
    outs = [r.forward(c, torch.tensor([[5]]), c.host_lens) for r, c in zip((direct, own), caches)]
    assert_equal(*outs)
    assert not torch.equal(before, outs[0])


def _replace(model, entry):
    """Replaces one entry that the stacked op reads; returns the new tensor."""
    layer = model.model.layers[1]
    if entry in ("norm data", "linear data"):  # the same object, new storage (as module.to)
        module = layer.post_attention_layernorm if entry == "norm data" else layer.mlp.down_proj
        module.weight.data = module.weight.data * 1.5
        return module.weight
    if entry == "norm":
        module, name = layer.post_attention_layernorm, "weight"
    elif entry == "final norm":
        module, name = model.model.norm, "weight"
    elif entry == "bias":
        module, name = layer.self_attn.o_proj, "bias"
    else:
        module, name = layer.mlp.down_proj, "weight"
    size = module.weight.shape[0]
    new = torch.nn.Parameter(torch.full((size,), 0.5) if name == "bias" else module.weight * 1.5,
                             requires_grad=False)
    setattr(module, name, new)
    return new


@pytest.mark.parametrize("entry", ["norm", "final norm", "bias", "linear weight", "quantized weight",
                                   "norm data", "linear data"])
def test_stack_arguments_are_rebuilt_when_an_entry_they_read_is_replaced(entry):
    model = tiny_model("llama", vocab=61)
    if entry == "quantized weight":
        quantize_model(model, 8, 32)
    direct = DirectForward(model)
    takes = lambda *args: True  # noqa: E731
    first = direct.stack_arguments(torch.float32, direct.num_layers, takes)
    assert direct.stack_arguments(torch.float32, direct.num_layers, takes) is first  # cached
    if entry == "quantized weight":
        from specdec_kernels.models.quantized_weight import quantize_weight, set_weight

        module = model.model.layers[1].mlp.down_proj
        new = quantize_weight(module.weight.dequantize() * 1.5, 8, 32)
        set_weight(module, new)
        new = new.qweight
    else:
        new = _replace(model, entry)
    if entry.endswith(" data"):  # no registration announces it: seen after refresh()
        assert direct.stack_arguments(torch.float32, direct.num_layers, takes) is first
        direct.refresh()
    again = direct.stack_arguments(torch.float32, direct.num_layers, takes)
    assert again is not first
    norms, linears = again[0], again[1]
    # The new tensor itself (or a view of its storage: weights and biases enter detached).
    assert any(t.data_ptr() == new.data_ptr() for t in list(norms) + [x for x in linears if x is not None])


@torch.inference_mode()
def test_a_sliding_window_that_cuts_rows_goes_to_the_models_forward():
    model = tiny_model("mistral", vocab=61, sliding_window=16)
    direct, own = runners(model)
    caches = [r.new_cache(1, 64) for r in (direct, own)]
    long_prompt = [list(range(1, 30))]
    outs = [r.prefill(c, long_prompt, want_features=True) for r, c in zip((direct, own), caches)]
    assert_equal(*outs)
    assert direct._direct.window == 16 and not direct._direct.covers(17)
    outs = [r.forward(c, torch.tensor([[5, 6]]), c.host_lens) for r, c in zip((direct, own), caches)]
    assert_equal(*outs)


@torch.inference_mode()
def test_rows_verified_in_a_block_equal_rows_decoded_one_at_a_time(model):
    """Batch invariance of the whole direct forward, bit for bit: what makes speculative
    output equal plain output."""
    direct = ModelRunner(model, cpu_kernels=True)
    caches = [direct.new_cache(1, 32) for _ in range(2)]
    for cache in caches:
        direct.prefill(cache, prompts(61)[:1])
    chain = [9, 4, 33, 2]
    block = direct.forward(caches[0], torch.tensor([chain]), caches[0].host_lens)
    for i, token in enumerate(chain):
        one = direct.forward(caches[1], torch.tensor([[token]]), caches[1].host_lens)
        caches[1].extend([1])
        assert torch.equal(one[0, 0], block[0, i]), i


def test_other_architectures_are_named_and_left_to_the_model():
    model = tiny_model("gemma3", vocab=61)
    reason = unsupported_reason(model)
    assert "gemma3" in reason
    with pytest.raises(ValueError, match="gemma3"):
        DirectForward(model)
    runner = ModelRunner(model, cpu_kernels=True)
    cache = runner.new_cache(1, 32)
    with torch.inference_mode():
        runner.prefill(cache, prompts(61)[:1])
    assert runner._direct is False and "gemma3" in runner.direct_reason
    with pytest.raises(ValueError, match="direct_forward=True.*gemma3"):
        forced = ModelRunner(model, cpu_kernels=True, direct_forward=True)
        with torch.inference_mode():
            forced.prefill(forced.new_cache(1, 32), prompts(61)[:1])


def test_exit_layer_out_of_range_is_refused_on_both_paths():
    model = tiny_model("llama", vocab=61)
    for runner in runners(model):
        cache = runner.new_cache(1, 32)
        with torch.inference_mode(), pytest.raises(ValueError, match="exit_layer must be in"):
            runner.forward(cache, torch.tensor([[1, 2]]), [0], exit_layer=3)


def test_stack_arguments_stay_cached_across_unrelated_registrations_and_hooks():
    model = tiny_model("llama", vocab=61)
    direct = DirectForward(model)
    takes = lambda *args: True  # noqa: E731
    first = direct.stack_arguments(torch.float32, direct.num_layers, takes)
    other = torch.nn.Linear(3, 3)  # another module registers parameters: every weight is read again
    other.weight = torch.nn.Parameter(torch.zeros(3, 3))
    assert direct.stack_arguments(torch.float32, direct.num_layers, takes) is first
    direct.refresh()
    assert direct.stack_arguments(torch.float32, direct.num_layers, takes) is first
    assert not direct.hooked()
    handle = other.register_forward_hook(lambda *a: None)  # a hook elsewhere
    assert not direct.hooked()
    inner = model.model.layers[0].mlp.register_forward_pre_hook(lambda *a: None)
    assert direct.hooked() and direct.hooked()
    inner.remove()
    assert not direct.hooked()
    handle.remove()


@torch.inference_mode()
def test_a_weight_swapped_in_place_between_generations_is_seen():
    model = tiny_model("llama", vocab=61)
    direct, own = runners(model)
    outs = []
    for scale in (1.0, 1.5):
        layer = model.model.layers[1].mlp.down_proj
        layer.weight.data = layer.weight.data * scale  # as module.to does: the same Parameter
        for r in (direct, own):
            cache = r.new_cache(1, 32)
            r.prefill(cache, prompts(61)[:1])
            outs.append(r.forward(cache, torch.tensor([[5]]), cache.host_lens))
    assert_equal(outs[0], outs[1])
    assert_equal(outs[2], outs[3])
    assert not torch.equal(outs[0], outs[2])


@torch.inference_mode()
def test_a_hooked_model_runs_its_own_forward_and_observers_see_both_paths():
    from specdec_kernels.decoding.runner import observe_forwards

    model = tiny_model("llama", vocab=61)
    direct, own = runners(model)
    seen, hooked = [], []
    handle = observe_forwards(model, lambda width, batch: seen.append((width, batch)))
    caches = [r.new_cache(1, 32) for r in (direct, own)]
    for r, c in zip((direct, own), caches):
        r.prefill(c, prompts(61)[:1])
    assert seen == [(7, 1), (7, 1)] and direct._direct and not direct._direct.hooked()
    hook = model.model.layers[-1].register_forward_hook(lambda *a: hooked.append(1))
    outs = [r.forward(c, torch.tensor([[5, 6]]), c.host_lens) for r, c in zip((direct, own), caches)]
    assert_equal(*outs)
    assert len(hooked) == 2  # the direct runner called the model: its hook ran
    hook.remove()
    direct.forward(caches[0], torch.tensor([[5]]), caches[0].host_lens, exit_layer=1)
    direct.forward(caches[0], torch.tensor([[5]]), caches[0].host_lens)
    assert len(hooked) == 2 and seen[2:] == [(2, 1), (2, 1), (1, 1)]  # no early exits
    handle.remove()
    direct.forward(caches[0], torch.tensor([[5]]), caches[0].host_lens)
    assert len(seen) == 5


@torch.inference_mode()
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("ragged", [True, False])
def test_a_narrow_cache_matches_on_both_paths(family, ragged):
    """A bfloat16 cache under a float32 model (a drafter's ``narrow_kv``): both paths round the
    K/V alike as they write them (contiguous and ragged rows) and read them alike, so logits
    and caches stay bit-identical; the first layer's rows are the float32 cache's, rounded."""
    model = randomise_norms(tiny_model(family, vocab=61, layers=3,
                                       attention_bias=family == "llama"))
    direct, own = runners(model)
    assert direct.narrow_kv_dtype() == torch.bfloat16
    caches = [r.new_cache(2, 64, torch.bfloat16) for r in (direct, own)]
    wide = direct.new_cache(2, 64)
    lists = prompts(61) if ragged else [p[:7] for p in prompts(61, seed=1)]
    for runner, cache in zip((direct, own, direct), caches + [wide]):
        runner.prefill(cache, lists)
    assert caches[0].buffer.dtype == torch.bfloat16
    assert_equal(caches[0].buffer, caches[1].buffer)
    assert_equal(caches[0].buffer[0], wide.buffer[0].to(torch.bfloat16))
    starts = list(caches[0].host_lens)
    # ragged: rows written by index; else one row range
    assert (starts[0] != starts[1]) == ragged
    tokens = torch.tensor([[3, 5, 7, 11, 13], [17, 19, 23, 29, 31]])
    tree = torch.tensor([[-1, 0, 0, 1, -2], [-1, 0, 1, 2, 3]])
    outs = [r.forward(c, tokens, starts, tree) for r, c in zip((direct, own), caches)]
    assert_equal(*outs)
    assert_equal(caches[0].buffer, caches[1].buffer)
    reference = direct.forward(wide, tokens, starts, tree)
    # bfloat16 K/V (8 bits of mantissa) move the logits by rounding, not more.
    assert 0 < (outs[0] - reference).norm() < 0.02 * reference.norm()


def test_a_narrow_cache_only_where_the_forwards_read_it():
    model = tiny_model("llama", vocab=61)
    runner = ModelRunner(model, cpu_kernels=True)
    with pytest.raises(ValueError, match="kv_dtype=torch.float16"):
        runner.new_cache(1, 8, torch.float16)
    torch_kernels = ModelRunner(model, cpu_kernels=False)
    assert torch_kernels.narrow_kv_dtype() is None
    with pytest.raises(ValueError, match="kv_dtype=torch.bfloat16.*package's CPU kernels"):
        torch_kernels.new_cache(1, 8, torch.bfloat16)
    bf16 = ModelRunner(tiny_model("llama", vocab=61, dtype=torch.bfloat16), cpu_kernels=True)
    assert bf16.narrow_kv_dtype() is None
    assert bf16.new_cache(1, 8, torch.bfloat16).dtype == torch.bfloat16  # its own dtype
