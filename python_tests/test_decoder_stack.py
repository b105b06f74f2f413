"""``decoder_stack_``: a model's decoder layers over one block in one op.

Against the direct forward's own Python loop (``DirectForward.__call__``), bit for bit: logits,
captured features and every cached K/V row, for prefill, chains, trees, ragged batches, extra
rows, early exit and last-row logits, float and file-precision weights, q/k/v and gate/up
joined or separate; against the reference (float64 linears) within rounding, with captures in
the caller's order; bad input named; and what the op does not reproduce (Qwen3's per-head
norms) left to the loop."""

import pytest
import torch

from python_tests.decoding_helpers import randomise_norms, tiny_model
from specdec_kernels import ops, reference
from specdec_kernels.decoding.drafter import ExtraRows
from specdec_kernels.decoding.runner import FeatureSpec, ModelRunner
from specdec_kernels.models.quantized_weight import quantize_model

CASES = [("llama", torch.float32), ("llama", torch.bfloat16), ("qwen2", torch.float32),
         ("mistral", torch.bfloat16), ("llama", "int4"), ("qwen2", "int8")]


def _model(family, dtype):
    if dtype in ("int4", "int8"):
        model = tiny_model(family, vocab=61, layers=3, attention_bias=family == "llama")
        return quantize_model(model, bits=int(dtype[-1]), group=32)
    return tiny_model(family, vocab=61, layers=3, dtype=dtype, attention_bias=family == "llama")


@pytest.fixture(scope="module", params=CASES,
                ids=lambda p: f"{p[0]}-{str(p[1]).replace('torch.', '')}")
def model(request):
    model = _model(*request.param)
    return randomise_norms(model)


class CountingStack:
    """``ops.decoder_stack_`` that counts its calls (to show which path a forward took)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return torch.ops.specdec.decoder_stack_(*args[:15], list(kwargs.get("capture", ())))


def assert_equal(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a, b), (a - b).abs().max()


def run_blocks(runner, one_op=True):
    """Prefill (ragged, features), a tree, a chain with extra rows, an early exit and a
    last-row forward on one runner (its layers in one op, or the Python loop); every output
    and the cache at the end."""
    runner._direct_available().one_op = one_op
    cache = runner.new_cache(2, 64)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 61, (n,), generator=gen).tolist() for n in (7, 13)]
    spec = FeatureSpec((0, -1, "final_norm"), prompt_rows="all")
    outs = [runner.prefill(cache, prompts, want_features=spec)]
    starts = list(cache.host_lens)
    tokens = torch.tensor([[3, 5, 7, 11, 13], [17, 19, 23, 29, 31]])
    tree = torch.tensor([[-1, 0, 0, 1, -2], [-1, 0, 1, 2, 3]])
    outs += list(runner.forward(cache, tokens, starts, tree, features=FeatureSpec((2, 0))))
    extra = ExtraRows(  # a chain of 3 with two lookahead-style rows after it
        tokens=torch.tensor([[8, 10], [7, 9]]),
        positions=torch.tensor([[1, 2], [2, 3]]),
        mask=torch.tensor([[[0b01001], [0b11001]], [[0b01011], [0b11011]]], dtype=torch.int32),
    )
    chain = torch.tensor([[2, 4, 6, 8, 10], [1, 3, 5, 7, 9]])
    outs.append(runner.forward(cache, chain, [s + 5 for s in starts], extra=extra))
    for last in (False, True):
        outs.append(runner.forward(cache, tokens[:, :3], [s + 10 for s in starts], exit_layer=2,
                                   last_logits_only=last))
        outs.append(runner.forward(cache, tokens[:, :3], [s + 10 for s in starts],
                                   last_logits_only=last, prefill=True))
    return outs, cache.buffer


@torch.inference_mode()
def test_the_op_gives_the_python_loops_bits(model, monkeypatch):
    counting = CountingStack()
    monkeypatch.setattr(ops, "decoder_stack_", counting)
    fused, fused_cache = run_blocks(ModelRunner(model, cpu_kernels=True))
    assert counting.calls >= 4  # every forward after the first write
    calls = counting.calls
    loop, loop_cache = run_blocks(ModelRunner(model, cpu_kernels=True), one_op=False)
    assert counting.calls == calls
    assert len(fused) == len(loop)
    for a, b in zip(fused, loop):
        assert_equal(a, b)
    assert_equal(fused_cache, loop_cache)


@torch.inference_mode()
def test_qwen3_per_head_norms_stay_with_the_loop(monkeypatch):
    counting = CountingStack()
    monkeypatch.setattr(ops, "decoder_stack_", counting)
    runner = ModelRunner(tiny_model("qwen3", vocab=61, layers=2), cpu_kernels=True)
    cache = runner.new_cache(1, 16)
    runner.prefill(cache, [[1, 2, 3]])
    runner.forward(cache, torch.tensor([[4, 5]]), list(cache.host_lens))
    assert counting.calls == 0 and runner.forward_path == "direct"


@torch.inference_mode()
def test_a_replaced_weight_is_seen_by_the_op():
    model = tiny_model("llama", vocab=61, layers=2)
    runner = ModelRunner(model, cpu_kernels=True)
    cache = runner.new_cache(1, 32)
    runner.prefill(cache, [[1, 2, 3]])
    before = runner.forward(cache, torch.tensor([[4]]), [3])
    down = model.model.layers[1].mlp.down_proj
    down.weight = torch.nn.Parameter(down.weight * 2, requires_grad=False)
    after = runner.forward(cache, torch.tensor([[4]]), [3])
    assert not torch.equal(before, after)
    own = ModelRunner(model, cpu_kernels=True, direct_forward=False)
    own_cache = own.new_cache(1, 32)
    own.prefill(own_cache, [[1, 2, 3]])
    assert_equal(after, own.forward(own_cache, torch.tensor([[4]]), [3]))


# ----------------------------------------------------------------------------- op level


def stack_operands(gen, *, joined, quantized, batch=2, width=3, layers=2, ragged=False):
    """Random operands of a small GQA stack (H 64, 4 query / 2 KV heads of D 16, I 32)."""
    hidden, heads, kv_heads, head_dim, inner, capacity = 64, 4, 2, 16, 32, 20

    def weight(n, k):
        dense = torch.randn(n, k, generator=gen) / k**0.5
        if not quantized:
            return [dense, None, None, torch.randn(n, generator=gen) * 0.1]
        q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        return [q, torch.rand(n, k // 16, generator=gen) * 0.01, None, None]

    linears = []
    for _ in range(layers):
        if joined:
            linears += weight((heads + 2 * kv_heads) * head_dim, hidden) + [None] * 8
        else:
            linears += weight(heads * head_dim, hidden) + weight(kv_heads * head_dim, hidden)
            linears += weight(kv_heads * head_dim, hidden)
        linears += weight(hidden, heads * head_dim)
        linears += weight(2 * inner, hidden) + [None] * 4 if joined else (
            weight(inner, hidden) + weight(inner, hidden))
        linears += weight(hidden, inner)
    prefix = torch.tensor([5, 9][:batch]) if ragged else torch.full((batch,), 7)
    positions = prefix[:, None] + torch.arange(width)
    angle = positions[..., None].float() * torch.linspace(0.1, 1.0, head_dim)
    masks = ops.build_tree_masks(torch.tensor([[-1] + list(range(width - 1))] * batch), prefix)
    kv = torch.randn(layers, 2, batch, kv_heads, capacity, head_dim, generator=gen)
    index = (prefix[:, None] + torch.arange(width)) if ragged else None
    return dict(
        hidden=torch.randn(batch, width, hidden, generator=gen), cos=angle.cos(), sin=angle.sin(),
        kv_cache=kv, write_start=0 if ragged else 7, write_index=index,
        kv_len=int(prefix.max()) + width, cache_lens=prefix, tree_mask=masks.packed_mask,
        norms=[torch.rand(hidden, generator=gen) + 0.5 for _ in range(2 * layers + 1)],
        linears=linears, num_heads=heads, num_kv_heads=kv_heads, scale=head_dim**-0.5, eps=1e-6,
    )


def on_device(args: dict, device) -> dict:
    """The operands (tensors, and tensors in lists) moved to ``device``."""
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        return [move(x) for x in v] if isinstance(v, list) else v
    return {k: move(v) for k, v in args.items()}


@pytest.mark.parametrize("joined", [True, False])
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("ragged", [False, True])
def test_the_op_matches_the_reference(gen, device, joined, quantized, ragged):
    """On CPU and, where there is one, on CUDA (the composite decomposes into the ops' CUDA
    kernels there); the reference runs on CPU."""
    args = stack_operands(gen, joined=joined, quantized=quantized, ragged=ragged)
    want_cache = args["kv_cache"].clone()
    args = on_device(args, device)
    got, captured = ops.decoder_stack_(**args, capture=[1, 0])
    got, captured = got.cpu(), [c.cpu() for c in captured]
    on_cpu = dict(on_device(args, "cpu"), kv_cache=want_cache)
    want, want_captured = reference.decoder_stack_(**on_cpu, capture=[1, 0])
    tol = dict(rtol=2e-3, atol=2e-3) if quantized else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, **tol)
    assert len(captured) == 2
    for a, b in zip(captured, want_captured):
        torch.testing.assert_close(a, b, **tol)
    assert not torch.equal(captured[0], captured[1])
    torch.testing.assert_close(args["kv_cache"].cpu(), want_cache, **tol)


def test_a_row_alone_gives_the_same_bits(gen):
    """Batch invariance (CPU: on CUDA quantized_linear runs through torch's GEMM): request 1 of
    a batch of 2 equals the same request run alone."""
    args = stack_operands(gen, joined=True, quantized=True, ragged=True)
    alone = dict(args, hidden=args["hidden"][1:], cos=args["cos"][1:], sin=args["sin"][1:],
                 kv_cache=args["kv_cache"][:, :, 1:].clone(), write_index=args["write_index"][1:],
                 cache_lens=args["cache_lens"][1:], tree_mask=args["tree_mask"][1:])
    both, _ = ops.decoder_stack_(**args)
    one, _ = ops.decoder_stack_(**alone)
    assert_equal(both[1:], one)


def bad(args, **changes):
    return dict(args, **changes)


@pytest.mark.parametrize("change,message", [
    (lambda a: bad(a, linears=a["linears"][:-1]), "28 entries a layer"),
    (lambda a: bad(a, norms=a["norms"][:-1]), "2L \\+ 1"),
    (lambda a: bad(a, kv_cache=a["kv_cache"][:1]), "kv_cache must be"),
    (lambda a: bad(a, num_kv_heads=3), "kv_cache must be"),
    (lambda a: bad(a, num_heads=5), "multiple of num_kv_heads"),
    (lambda a: bad(a, num_heads=-4), "multiple of num_kv_heads"),
    (lambda a: bad(a, num_heads=8), "q/k/v have 64/32/32 columns, not Hq D = 128"),
    (lambda a: bad(a, kv_len=100), "kv_len"),
    (lambda a: bad(a, write_start=8), "do not fit in kv_len"),
    (lambda a: bad(a, write_start=2**63 - 2), "do not fit in kv_len"),  # start + T wraps
    (lambda a: bad(a, write_index=torch.zeros(2, 2, dtype=torch.int64)), "write_index must be"),
    (lambda a: bad(a, write_index=torch.zeros(2, 3, dtype=torch.int32)), "write_index must be"),
    (lambda a: bad(a, hidden=a["hidden"][0]), "hidden must be"),
    (lambda a: bad(a, linears=[None] * 4 + a["linears"][4:]), "has no weight"),
    (lambda a: bad(a, linears=a["linears"][:4] + [None] * 4 + a["linears"][8:]),
     "k weight without"),
    (lambda a: bad(a, linears=a["linears"][:5] + [None] + a["linears"][6:]), "mins without scales"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_is_named(gen, change, message):
    args = stack_operands(gen, joined=False, quantized=True)
    if "mins" in message:  # a linear with mins but no scales
        args["linears"][6] = args["linears"][1]
    with pytest.raises(ValueError, match=message):
        ops.decoder_stack_(**change(args))


def test_separate_k_and_v_of_fewer_heads_do_not_broadcast_into_the_cache(gen):
    """One KV head's worth of k and v (with the q of a model whose num_kv_heads is 2) would be
    copied into both heads' cache rows: refused instead."""
    args = stack_operands(gen, joined=False, quantized=False)
    for slot in (1, 2):  # layer 0's k and v (weight, scales, mins, bias)
        weight, scales, mins, bias = args["linears"][4 * slot : 4 * slot + 4]
        args["linears"][4 * slot : 4 * slot + 4] = [weight[:16], scales, mins, bias[:16]]
    with pytest.raises(ValueError, match="q/k/v have 64/16/16 columns, not Hq D = 64 and Hkv D = 32"):
        ops.decoder_stack_(**args)


def test_a_capture_point_outside_the_layers_is_named(gen):
    args = stack_operands(gen, joined=True, quantized=False)
    with pytest.raises(ValueError, match="capture point 2"):
        ops.decoder_stack_(**args, capture=[2])


def test_a_joined_projection_of_the_wrong_width_is_named(gen):
    args = stack_operands(gen, joined=True, quantized=False)
    args["linears"][0] = args["linears"][0][:-16]
    args["linears"][3] = args["linears"][3][:-16]
    with pytest.raises(ValueError, match="joined q/k/v has 112 columns"):
        ops.decoder_stack_(**args)


@pytest.mark.parametrize("quantized", [False, True])
def test_opcheck(gen, quantized):
    """Schema (only the cache is written), fake tensors (the composite decomposes into ops that
    have fakes) and AOT dispatch."""
    a = stack_operands(gen, joined=quantized, quantized=quantized, ragged=True)
    args = (a["hidden"], a["cos"], a["sin"], a["kv_cache"], a["write_start"], a["write_index"],
            a["kv_len"], a["cache_lens"], a["tree_mask"], a["norms"], a["linears"],
            a["num_heads"], a["num_kv_heads"], a["scale"], a["eps"], [1, 0])
    torch.library.opcheck(torch.ops.specdec.decoder_stack_.default, args)


@torch.inference_mode()
def test_float_weights_the_kernel_does_not_take_stay_with_the_loop(monkeypatch):
    """float16 linears run torch's linear in the loop (the small-batch kernel takes float32 and
    bfloat16): the op, which would call the kernel, is not used."""
    counting = CountingStack()
    monkeypatch.setattr(ops, "decoder_stack_", counting)
    model = tiny_model("llama", vocab=61, layers=2, dtype=torch.float16)
    runner = ModelRunner(model, cpu_kernels=True)
    cache = runner.new_cache(1, 16)
    runner.prefill(cache, [[1, 2, 3]])
    runner.forward(cache, torch.tensor([[4, 5]]), list(cache.host_lens))
    assert counting.calls == 0 and runner.forward_path == "direct"
