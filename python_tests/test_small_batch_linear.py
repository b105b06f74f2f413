"""small_batch_linear vs the reference, its batch invariance (bit for bit, on every CPU code
path), opcheck, torch.compile, the routing of a module's linears, and bad input."""

import pytest
import torch
import torch.nn.functional as F

from python_tests.conftest import DEVICES
from specdec_kernels import ops, reference
from specdec_kernels.decoding.cpu_matmul import KernelWeight, RoutedLinears

DTYPES = [torch.float32, torch.bfloat16]
# Odd sizes: K not a multiple of any vector width, N not a multiple of the weight tile.
SHAPES = [(1, 1, 1), (1, 7, 5), (2, 13, 37), (3, 33, 16), (5, 129, 95), (8, 64, 577), (7, 11, 2053),
          (17, 19, 1031), (32, 40, 64), (33, 9, 70)]


def tolerance(dtype, k, device="cpu"):
    # float32 accumulation of k products; bfloat16 output is rounded to 8 bits. On CUDA the op is
    # cuBLAS, which may round bfloat16 partial sums of a split K (torch's default
    # allow_bf16_reduced_precision_reduction): a few bfloat16 ulps of a sum of size ~sqrt(k),
    # seen as 0.17 at k = 1031 on an H200 (2026-11-26).
    if dtype != torch.bfloat16:
        return dict(rtol=1e-5, atol=1e-5 * k ** 0.5)
    return dict(rtol=1e-2, atol=2**-7 * k ** 0.5 if device == "cuda" else 1e-2)


def operands(m, n, k, dtype, device, gen, bias=True):
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    w = torch.randn(n, k, generator=gen).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    return x, w, b


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference(device, m, n, k, dtype, bias, gen):
    x, w, b = operands(m, n, k, dtype, device, gen, bias)
    got = ops.small_batch_linear(x, w, b)
    want = reference.small_batch_linear(x, w, b)
    assert got.shape == (m, n) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype, k, device))


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_cpu_path_matches_reference(cpu_isa, m, n, k, dtype, gen):
    x, w, b = operands(m, n, k, dtype, "cpu", gen)
    got = ops.small_batch_linear(x, w, b)
    torch.testing.assert_close(got.float(), reference.small_batch_linear(x, w, b).float(),
                               **tolerance(dtype, k))


ROWS = 300  # crosses the 128-row passes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [5, 64, 577, 1100, 1536, 2053])
def test_batch_invariant(cpu_isa, dtype, k, gen):
    """Each row is bit-identical alone, in any batch (2 .. 300 rows) and at any position."""
    n = 67
    x, w, b = operands(ROWS, n, k, dtype, "cpu", gen)
    alone = torch.stack([ops.small_batch_linear(x[i : i + 1], w, b)[0] for i in range(ROWS)])
    for m in (2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 32, 129, ROWS):
        for start in (0, ROWS - m, (ROWS - m) // 3):
            out = ops.small_batch_linear(x[start : start + m], w, b)
            assert torch.equal(out, alone[start : start + m]), (m, start)
    perm = torch.randperm(ROWS, generator=gen)
    assert torch.equal(ops.small_batch_linear(x[perm], w, b), alone[perm])


def test_batch_invariant_whatever_the_threads(gen):
    x, w, b = operands(9, 301, 200, torch.float32, "cpu", gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = ops.small_batch_linear(x, w, b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(ops.small_batch_linear(x, w, b), single)


def test_leading_dims_and_strided_inputs(device, gen):
    x = torch.randn(2, 3, 40, generator=gen).to(device)
    w = torch.randn(11, 40, generator=gen).to(device)
    got = ops.small_batch_linear(x, w)
    assert got.shape == (2, 3, 11)
    torch.testing.assert_close(got, reference.small_batch_linear(x, w), rtol=1e-5, atol=1e-5)
    wide = torch.randn(11, 60, generator=gen).to(device)[:, :40]  # rows 60 apart
    torch.testing.assert_close(ops.small_batch_linear(x[:, :, :], wide),
                               reference.small_batch_linear(x, wide), rtol=1e-5, atol=1e-5)
    xt = torch.randn(40, 6, generator=gen).to(device).t()  # non-contiguous x
    torch.testing.assert_close(ops.small_batch_linear(xt, w), reference.small_batch_linear(xt, w),
                               rtol=1e-5, atol=1e-5)


def test_empty_and_zero_k(device):
    w = torch.randn(5, 3, device=device)
    assert ops.small_batch_linear(torch.empty(0, 3, device=device), w).shape == (0, 5)
    b = torch.arange(4.0, device=device)
    out = ops.small_batch_linear(torch.empty(2, 0, device=device), torch.empty(4, 0, device=device), b)
    assert out.tolist() == [b.tolist()] * 2


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device):
    x = torch.randn(2, 8, device=device)
    w = torch.randn(3, 8, device=device)
    with pytest.raises(ValueError, match=r"last dims must match|K"):
        ops.small_batch_linear(x, torch.randn(3, 7, device=device))
    with pytest.raises(ValueError, match="weight"):
        ops.small_batch_linear(x, torch.randn(3, 8, 1, device=device))
    with pytest.raises(ValueError, match="dtype"):
        ops.small_batch_linear(x, w.double())
    with pytest.raises(ValueError, match="bias"):
        ops.small_batch_linear(x, w, torch.randn(4, device=device))
    if device == "cpu":
        with pytest.raises(ValueError, match="float32 or bfloat16"):
            ops.small_batch_linear(x.half(), w.half())
    with pytest.raises(ValueError, match="cap"):
        ops.cpu_isa("sse9")


def test_opcheck(device, gen):
    x, w, b = operands(3, 10, 17, torch.float32, device, gen)
    torch.library.opcheck(torch.ops.specdec.small_batch_linear.default, (x, w, b))
    torch.library.opcheck(torch.ops.specdec.small_batch_linear.default, (x, w, None))


def test_compile_fullgraph(device, gen):
    x, w, b = operands(4, 12, 33, torch.float32, device, gen)

    @torch.compile(fullgraph=True, backend="eager")
    def f(x, w, b):
        return ops.small_batch_linear(x, w, b) * 2

    torch.testing.assert_close(f(x, w, b), 2 * ops.small_batch_linear(x, w, b))


def test_routing_sends_a_modules_cpu_linears_to_the_kernel(gen):
    x, w, b = operands(4, 12, 33, torch.float32, "cpu", gen)
    net = torch.nn.Sequential(torch.nn.Linear(33, 12), torch.nn.Linear(12, 5).half())
    with torch.no_grad():
        net[0].weight.copy_(w)
        net[0].bias.copy_(b)
    own = net[0].weight
    routed = RoutedLinears(net)
    with torch.no_grad():
        with routed():
            assert isinstance(net[0].weight, KernelWeight)
            assert not isinstance(net[1].weight, KernelWeight)  # not a supported dtype: torch
            out = net[0](x)
            half = net[1](out.half())
        with routed(gemm_rows=4):
            unrouted = net[0](x)  # gemm_rows and more: torch's GEMM
            small = net[0](x[:3])
        outside = net[0](x)
    assert net[0].weight is own
    assert torch.equal(out, ops.small_batch_linear(x, w, b))
    torch.testing.assert_close(unrouted, F.linear(x, w, b))
    assert torch.equal(small, ops.small_batch_linear(x[:3], w, b))
    torch.testing.assert_close(outside, F.linear(x, w, b))
    assert half.dtype == torch.float16
    with pytest.raises(ValueError, match="gemm_rows"):
        routed(gemm_rows=1)


def test_routing_follows_a_replaced_weight_and_restores_on_error(gen):
    x, w, b = operands(3, 7, 19, torch.float32, "cpu", gen)
    layer = torch.nn.Linear(19, 7)
    routed = RoutedLinears(layer)
    with torch.no_grad():
        with routed():
            layer(x)
        layer.weight = torch.nn.Parameter(w)  # replaced after the routing saw the layer
        layer.bias = torch.nn.Parameter(b)
        with routed():
            assert torch.equal(layer(x), ops.small_batch_linear(x, w, b))
        with pytest.raises((RuntimeError, ValueError)):
            with routed():
                layer(x[:, :5])  # wrong width: an error, and the weight is restored all the same
    assert type(layer.weight) is torch.nn.Parameter and layer.weight.data_ptr() == w.data_ptr()
