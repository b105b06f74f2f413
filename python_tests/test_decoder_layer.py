"""The decoder-layer glue ops (rms_norm, add_rms_norm, rotary_embedding, silu_mul) against the
reference over odd shapes and every float dtype (bit for bit on CPU: each op gives the bits of
the torch expression it replaces), strided inputs as the direct forward passes them, batch
invariance bit for bit, opcheck and bad input. Cases follow vLLM's kernel tests
(tests/kernels/core: layernorm with and without the residual, rotary embedding in the
rotate-half form, silu-and-mul)."""

import pytest
import torch

from python_tests.conftest import FLOAT_DTYPES
from specdec_kernels import ops, reference

# (rows, H): one decoding row, a tree, a prefill; H not a multiple of any vector width.
NORM_SHAPES = [(1, 8), (1, 576), (7, 13), (33, 1000), (130, 96), (3, 5120)]
# (B, T, H, D): query and key heads of odd counts, head dims of real models.
ROPE_SHAPES = [(1, 1, 9, 64), (2, 5, 3, 32), (1, 17, 4, 128), (3, 2, 1, 2), (1, 300, 2, 64)]


def tolerance(dtype):
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
            torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}[dtype]


def assert_matches(got, want, device, dtype):
    """The same bits on CPU; within rounding elsewhere (CUDA runs torch's own expression)."""
    if device == "cpu":
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        torch.testing.assert_close(got, want, **tolerance(dtype))


def norm_operands(rows, hidden, dtype, device, gen):
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype).to(device)
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype).to(device)
    return x, weight


@pytest.mark.parametrize("rows,hidden", NORM_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rms_norm_matches_reference(device, rows, hidden, dtype, gen):
    x, weight = norm_operands(rows, hidden, dtype, device, gen)
    got = ops.rms_norm(x, weight, 1e-6)
    want = reference.rms_norm(x, weight, 1e-6)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
    assert_matches(got, want, device, dtype)


@pytest.mark.parametrize("rows,hidden", NORM_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_add_rms_norm_matches_reference(device, rows, hidden, dtype, gen):
    x, weight = norm_operands(rows, hidden, dtype, device, gen)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
    total, normed = ops.add_rms_norm(x, residual, weight, 1e-5)
    want_total, want_normed = reference.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(total, want_total)  # the add is one rounding, as torch's
    assert_matches(normed, want_normed, device, dtype)
    assert torch.equal(normed, ops.rms_norm(total, weight, 1e-5))


def test_rms_norm_takes_leading_dimensions_and_strided_rows(device, gen):
    """``[B, T, H, D]`` per-head norms (Qwen3's q/k norms) on a view of a wider projection."""
    wide = torch.randn(2, 3, 5 * 16 + 7, generator=gen).to(device)
    heads = wide[..., : 5 * 16].view(2, 3, 5, 16)
    weight = torch.rand(16, generator=gen).to(device)
    assert_matches(ops.rms_norm(heads, weight, 1e-6), reference.rms_norm(heads, weight, 1e-6),
                   device, torch.float32)


def test_rms_norm_of_a_zero_row_is_zero_and_eps_is_used(device):
    x = torch.zeros(2, 9, device=device)
    x[1] = 1e-4
    weight = torch.ones(9, device=device)
    out = ops.rms_norm(x, weight, 1e-2)
    assert torch.equal(out[0], torch.zeros(9, device=device))
    # mean(x^2) = 1e-8 is negligible beside eps = 1e-2: out = x / sqrt(1e-2).
    torch.testing.assert_close(out[1], torch.full((9,), 1e-3, device=device), rtol=1e-4, atol=0)


@pytest.mark.parametrize("b,t,h,d", ROPE_SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rotary_embedding_is_bit_identical_to_the_torch_expression(device, b, t, h, d, dtype, gen):
    x = torch.randn(b, t, h, d, generator=gen).to(dtype).to(device)
    angle = torch.rand(b, t, d, generator=gen) * 50
    cos, sin = angle.cos().to(dtype).to(device), angle.sin().to(dtype).to(device)
    got = ops.rotary_embedding(x, cos, sin)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
    if device == "cpu":
        assert torch.equal(got, reference.rotary_embedding(x, cos, sin))
    else:
        torch.testing.assert_close(got, reference.rotary_embedding(x, cos, sin), **tolerance(dtype))


def test_rotary_embedding_on_query_and_key_heads_of_one_projection(device, gen):
    """The direct forward rotates q and k where they sit side by side in one q/k/v output
    (row stride wider than the heads), with cos/sin shared over the batch ([1, T, D])."""
    qkv = torch.randn(2, 4, (6 + 2 + 2) * 32, generator=gen).to(device)
    qk = qkv[..., : 8 * 32].view(2, 4, 8, 32)
    assert not qk.is_contiguous()
    angle = torch.rand(1, 4, 32, generator=gen)
    cos, sin = angle.cos().to(device), angle.sin().to(device)
    want = reference.rotary_embedding(qk.contiguous(), cos.expand(2, 4, 32), sin.expand(2, 4, 32))
    torch.testing.assert_close(ops.rotary_embedding(qk, cos, sin), want, rtol=0, atol=0)


def test_rotary_embedding_at_angle_zero_is_the_identity(device, gen):
    x = torch.randn(1, 3, 2, 8, generator=gen).to(device)
    ones, zeros = torch.ones(1, 3, 8, device=device), torch.zeros(1, 3, 8, device=device)
    assert torch.equal(ops.rotary_embedding(x, ones, zeros), x)


@pytest.mark.parametrize("rows,inner", [(1, 1), (1, 1536), (5, 37), (64, 8960), (3, 11)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_silu_mul_matches_reference(device, rows, inner, dtype, gen):
    gate_up = (torch.randn(rows, 2 * inner, generator=gen) * 4).to(dtype).to(device)
    gate, up = gate_up[:, :inner], gate_up[:, inner:]  # halves of one joined projection
    got = ops.silu_mul(gate, up)
    assert got.shape == (rows, inner) and got.dtype == dtype and got.is_contiguous()
    # torch's SiLU on a contiguous gate (as a module's own gate_proj output is): the same bits.
    assert_matches(got, reference.silu_mul(gate.contiguous(), up), device, dtype)


def test_silu_mul_at_extremes(device):
    gate = torch.tensor([[-100.0, -20.0, 0.0, 20.0, 100.0]], device=device)
    up = torch.full_like(gate, 2.0)
    out = ops.silu_mul(gate, up)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_op_is_batch_invariant(dtype, gen):
    """A row's result is the same bits alone as in a batch (what speculative verification
    needs of every op of the forward)."""
    x, weight = norm_operands(9, 200, dtype, "cpu", gen)
    residual = torch.randn(9, 200, generator=gen).to(dtype)
    rope = torch.randn(1, 9, 3, 16, generator=gen).to(dtype)
    cos, sin = torch.rand(1, 9, 16, generator=gen).to(dtype), torch.rand(1, 9, 16, generator=gen).to(dtype)
    full = [ops.rms_norm(x, weight, 1e-6), *ops.add_rms_norm(x, residual, weight, 1e-6),
            ops.silu_mul(x, residual)]
    for row in (0, 4, 8):
        one = [ops.rms_norm(x[row : row + 1], weight, 1e-6),
               *ops.add_rms_norm(x[row : row + 1], residual[row : row + 1], weight, 1e-6),
               ops.silu_mul(x[row : row + 1], residual[row : row + 1])]
        for a, b in zip(full, one):
            assert torch.equal(a[row : row + 1], b)
        alone = ops.rotary_embedding(rope[:, row : row + 1], cos[:, row : row + 1], sin[:, row : row + 1])
        assert torch.equal(ops.rotary_embedding(rope, cos, sin)[:, row : row + 1], alone)


def test_opcheck(device, gen):
    x, weight = norm_operands(3, 40, torch.float32, device, gen)
    residual = torch.randn(3, 40, generator=gen).to(device)
    torch.library.opcheck(torch.ops.specdec.rms_norm.default, (x, weight, 1e-6))
    torch.library.opcheck(torch.ops.specdec.add_rms_norm.default, (x, residual, weight, 1e-6))
    torch.library.opcheck(torch.ops.specdec.silu_mul.default, (x, residual))
    rope = torch.randn(2, 3, 4, 8, generator=gen).to(device)
    cos, sin = torch.rand(2, 3, 8, generator=gen).to(device), torch.rand(2, 3, 8, generator=gen).to(device)
    torch.library.opcheck(torch.ops.specdec.rotary_embedding.default, (rope, cos, sin))


def test_compile_fullgraph(gen):
    x, weight = norm_operands(2, 24, torch.float32, "cpu", gen)

    @torch.compile(fullgraph=True, backend="eager")
    def block(x, weight):
        total, normed = ops.add_rms_norm(x, x, weight, 1e-6)
        return ops.silu_mul(normed, total)

    torch.testing.assert_close(block(x, weight), ops.silu_mul(*reversed(ops.add_rms_norm(x, x, weight, 1e-6))))


@pytest.mark.parametrize("call,match", [
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6), r"weight must be \[H\] = \[8\]"),
    (lambda: ops.rms_norm(torch.randn(2, 8), torch.ones(8, dtype=torch.bfloat16), 1e-6),
     "weight must have x's dtype"),
    (lambda: ops.rms_norm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8, dtype=torch.int32), 1e-6),
     "x must be float32, bfloat16 or float16"),
    (lambda: ops.rms_norm(torch.randn(2, 0), torch.ones(0), 1e-6), "H > 0"),
    (lambda: ops.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-6),
     r"residual must have x's shape \[2, 8\], got \[3, 8\]"),
    (lambda: ops.rotary_embedding(torch.randn(1, 2, 3, 7), torch.ones(1, 2, 7), torch.ones(1, 2, 7)),
     "D even"),
    (lambda: ops.rotary_embedding(torch.randn(2, 3, 4), torch.ones(2, 3, 4), torch.ones(2, 3, 4)),
     r"x must be \[B, T, H, D\]"),
    (lambda: ops.rotary_embedding(torch.randn(2, 3, 1, 8), torch.ones(2, 4, 8), torch.ones(2, 3, 8)),
     r"cos must be \[B, T, D\] = \[2, 3, 8\]"),
    (lambda: ops.rotary_embedding(torch.randn(2, 3, 1, 8), torch.ones(2, 3, 8), torch.ones(2, 3, 8).double()),
     "sin must have x's dtype"),
    (lambda: ops.silu_mul(torch.randn(2, 8), torch.randn(2, 9)), r"up must have gate's shape \[2, 8\]"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
