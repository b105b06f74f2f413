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


# ------------------------------------------------------------------------ the one-call path
#
# Where every linear is a float32 or a panel weight and the activations are float32 on CPU, the
# op runs its layers without a dispatch per op (decoder_stack.cpp): the same kernels on buffers
# it reuses, so it must give the bits of the ops composed one by one.

#: Weights of a stack: float32, panels of every kind, and float32 and int4 linears alternating.
ONE_CALL_KINDS = ["float32", "int4", "int8", "int8-g16", "q4_k", "q6_k", "mixed"]


def linear_parts(n, k, kind, gen):
    """(weight, scales, mins, bias) of a random ``[n, k]`` float32 or panel weight of ``kind``
    with a bias that is not zero (a model's initial biases are, and would hide a missed
    bias)."""
    from python_tests.test_quantized_panels import kquant_weight
    from specdec_kernels.models.quantized_weight import pack_panels, quantize_weight

    if kind == "float32":
        return [torch.randn(n, k, generator=gen) / k**0.5, None, None,
                torch.randn(n, generator=gen) * 0.1]
    if kind.startswith("q"):
        weight = kquant_weight(n, k, gen, bits=4 if kind == "q4_k" else 8,
                               group=32 if kind == "q4_k" else 16)
    else:
        dense = torch.randn(n, k, generator=gen) / k**0.5
        weight = quantize_weight(dense, 4 if kind == "int4" else 8, 16 if kind == "int8-g16" else 32)
    packed = pack_panels(weight)
    assert packed.qweight.dim() == 3
    return [packed.qweight, packed.scales, packed.mins, torch.randn(n, generator=gen) * 0.1]


def one_call_operands(gen, kind, *, joined, batch, width, ragged, cache_dtype, layers=2):
    """A GQA stack of ``kind`` weights: H 256 (K-quant super-blocks need K % 256 = 0), 8 query
    / 4 KV heads of D 32, I 256; a chain of ``width`` rows after a prefix per request."""
    hidden, heads, kv_heads, head_dim, inner, capacity = 256, 8, 4, 32, 256, 24
    nq, nkv = heads * head_dim, kv_heads * head_dim
    kinds = iter(["float32", "int4"] * 8 * layers if kind == "mixed" else [kind] * 8 * layers)

    def parts(n, k):
        return linear_parts(n, k, next(kinds), gen)

    linears = []
    for _ in range(layers):
        if joined:
            linears += parts(nq + 2 * nkv, hidden) + [None] * 8
        else:
            for n in (nq, nkv, nkv):
                linears += parts(n, hidden)
        linears += parts(hidden, nq)
        if joined:
            linears += parts(2 * inner, hidden) + [None] * 4
        else:
            linears += parts(inner, hidden)
            linears += parts(inner, hidden)
        linears += parts(hidden, inner)
    prefix = torch.tensor([5, 11, 8][:batch]) if ragged else torch.full((batch,), 9)
    positions = prefix[:, None] + torch.arange(width)
    angle = positions[..., None].float() * torch.linspace(0.1, 1.0, head_dim)
    masks = ops.build_tree_masks(torch.tensor([[-1] + list(range(width - 1))] * batch), prefix)
    kv = torch.randn(layers, 2, batch, kv_heads, capacity, head_dim, generator=gen)
    return dict(
        hidden=torch.randn(batch, width, hidden, generator=gen), cos=angle.cos(), sin=angle.sin(),
        kv_cache=kv.to(cache_dtype), write_start=0 if ragged else 9,
        write_index=positions if ragged else None, kv_len=int(prefix.max()) + width,
        cache_lens=prefix, tree_mask=masks.packed_mask,
        norms=[torch.rand(hidden, generator=gen) + 0.5 for _ in range(2 * layers + 1)],
        linears=linears, num_heads=heads, num_kv_heads=kv_heads, scale=head_dim**-0.5, eps=1e-6,
    )


def stack_by_ops(a, capture=()):
    """``decoder_stack_`` composed from the ops one by one, writing ``a["kv_cache"]``: the bits
    the one-call path must give."""
    hidden, kv, eps, norms = a["hidden"], a["kv_cache"], a["eps"], a["norms"]
    batch, width, _ = hidden.shape
    heads, kv_heads, head_dim = a["num_heads"], a["num_kv_heads"], kv.shape[-1]
    nq, nkv = heads * head_dim, kv_heads * head_dim

    def linear(layer, slot, x):
        weight, scales, mins, bias = a["linears"][(layer * 7 + slot) * 4 : (layer * 7 + slot + 1) * 4]
        if scales is None:
            return ops.small_batch_linear(x, weight, bias)
        return ops.quantized_linear(x, weight, scales, mins, bias)

    def write(cache, rows):  # rows [B, T, Hkv, D] into cache [B, Hkv, S, D]
        block = rows.transpose(1, 2).to(cache.dtype)
        if a["write_index"] is None:
            cache[:, :, a["write_start"] : a["write_start"] + width] = block
        else:
            for b in range(batch):
                cache[b][:, a["write_index"][b]] = block[b]

    h, x, captured = hidden, ops.rms_norm(hidden, norms[0], eps), {}
    for layer in range(len(a["linears"]) // 28):
        if a["linears"][(layer * 7 + 1) * 4] is None:
            joined = linear(layer, 0, x)
            qk = ops.rotary_embedding(joined[..., : nq + nkv].reshape(batch, width, -1, head_dim),
                                      a["cos"], a["sin"])
            q, k = qk[:, :, :heads], qk[:, :, heads:]
            v = joined[..., nq + nkv :].reshape(batch, width, kv_heads, head_dim)
        else:
            q, k, v = (linear(layer, slot, x).view(batch, width, -1, head_dim) for slot in range(3))
            q, k = (ops.rotary_embedding(t, a["cos"], a["sin"]) for t in (q, k))
        write(kv[layer, 0], k)
        write(kv[layer, 1], v)
        out = ops.tree_attention(q, kv[layer, 0], kv[layer, 1], a["cache_lens"], a["tree_mask"],
                                 a["scale"])
        h, x = ops.add_rms_norm(linear(layer, 3, out.reshape(batch, width, -1)), h,
                                norms[1 + 2 * layer], eps)
        if a["linears"][(layer * 7 + 5) * 4] is None:
            both = linear(layer, 4, x)
            inner = both.shape[-1] // 2
            gated = ops.silu_mul(both[..., :inner], both[..., inner:])
        else:
            gated = ops.silu_mul(linear(layer, 4, x), linear(layer, 5, x))
        h, x = ops.add_rms_norm(linear(layer, 6, gated), h, norms[2 + 2 * layer], eps)
        captured[layer] = h
    return x, [captured[point] for point in capture]


@pytest.mark.parametrize("kind", ONE_CALL_KINDS)
@pytest.mark.parametrize("joined", [True, False])
@pytest.mark.parametrize("width,ragged", [(1, False), (5, True), (3, False)])
def test_the_one_call_path_gives_the_ops_bits(gen, kind, joined, width, ragged):
    """Output, captures (in the caller's order) and every cache row, bit for bit; a ragged
    batch writes its rows by index into a bfloat16 cache (as the quantized-self draft's)."""
    args = one_call_operands(gen, kind, joined=joined, batch=3, width=width, ragged=ragged,
                                cache_dtype=torch.bfloat16 if ragged else torch.float32)
    by_ops = dict(args, kv_cache=args["kv_cache"].clone())
    got, captured = ops.decoder_stack_(**args, capture=[1, 0])
    want, want_captured = stack_by_ops(by_ops, capture=[1, 0])
    assert torch.isfinite(got).all()
    assert_equal(got, want)
    for a, b in zip(captured, want_captured, strict=True):
        assert_equal(a, b)
    assert_equal(args["kv_cache"], by_ops["kv_cache"])


@pytest.mark.parametrize("kind", ["float32", "int4", "q4_k"])
def test_the_one_call_path_gives_a_row_alone_the_same_bits(gen, kind):
    args = one_call_operands(gen, kind, joined=True, batch=3, width=4, ragged=True,
                                cache_dtype=torch.float32)
    alone = dict(args, hidden=args["hidden"][1:2], cos=args["cos"][1:2], sin=args["sin"][1:2],
                 kv_cache=args["kv_cache"][:, :, 1:2].clone(), write_index=args["write_index"][1:2],
                 cache_lens=args["cache_lens"][1:2], tree_mask=args["tree_mask"][1:2])
    both, _ = ops.decoder_stack_(**args)
    one, _ = ops.decoder_stack_(**alone)
    assert_equal(both[1:2], one)


@pytest.mark.parametrize("joined,slot,rows,message", [
    (True, 0, 16, "layer 0's joined q/k/v has 496 columns, not \\(Hq \\+ 2 Hkv\\) D = 512"),
    (False, 1, 16, "layer 0's q/k/v have 256/112/128 columns, not Hq D = 256 and Hkv D = 128"),
    (True, 3, 16, "layer 0's o weight has 240 rows, not 256"),
    (True, 6, 16, "layer 0's down weight has 240 rows, not 256"),
    (False, 5, 16, "layer 0's up weight has 240 rows, not 256"),
])
def test_the_one_call_path_names_a_wrong_width(gen, joined, slot, rows, message):
    """A linear with one panel (16 rows) too few is named, before anything is computed."""
    args = one_call_operands(gen, "int4", joined=joined, batch=1, width=1, ragged=False,
                                cache_dtype=torch.float32)
    weight, scales, mins, bias = args["linears"][4 * slot : 4 * slot + 4]
    args["linears"][4 * slot : 4 * slot + 4] = [weight[:-1], scales[:-1], mins[:-1], bias[:-rows]]
    with pytest.raises(ValueError, match=message):
        ops.decoder_stack_(**args)


@pytest.mark.parametrize("kind,message", [
    ("int8", "quantized_linear: bias must be float32 of shape \\[512\\]"),
    ("float32", "small_batch_linear: bias must have shape \\[512\\]"),
])
def test_the_one_call_path_names_a_bias_of_the_wrong_shape(gen, kind, message):
    args = one_call_operands(gen, kind, joined=True, batch=1, width=1, ragged=False,
                             cache_dtype=torch.float32)
    args["linears"][3] = args["linears"][3][:-1]
    with pytest.raises(ValueError, match=message):
        ops.decoder_stack_(**args)
