"""quantized_linear vs the reference over odd shapes, formats and every CPU code path; its
batch invariance (bit for bit); opcheck; QuantizedWeight inside models; bad input."""

import pytest
import torch
import torch.nn.functional as F

from python_tests.conftest import DEVICES
from specdec_kernels import ops, reference
from specdec_kernels.decoding.cpu_matmul import RoutedLinears
from specdec_kernels.models.quantized_weight import (
    QuantizedWeight,
    joined_rows,
    lay_out_together,
    set_weight,
    pack_int4,
    quantize_model,
    quantize_weight,
    resident_bytes,
)

# (M, N, K, bits, group): K a whole number of groups but not of any vector width; N not a
# multiple of the weight tile.
SHAPES = [(1, 1, 32, 4, 32), (1, 7, 48, 8, 16), (2, 13, 96, 8, 32), (3, 33, 160, 4, 32),
          (5, 95, 352, 4, 32), (8, 57, 256, 4, 64), (17, 31, 1056, 4, 32), (4, 11, 1024, 4, 128),
          (33, 9, 80, 8, 16), (6, 70, 576, 8, 32)]


def operands(m, n, k, bits, group, gen, *, mins=True, scale_dtype=torch.float32,
             dtype=torch.float32, bias=False):
    x = torch.randn(m, k, generator=gen).to(dtype)
    if bits == 8:
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    else:
        q = torch.randint(0, 256, (n, k // 2), generator=gen).to(torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.05).to(scale_dtype)
    mn = (torch.randn(n, k // group, generator=gen) * 0.05).to(scale_dtype) if mins else None
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x, q, scales, mn, b


def tolerance(dtype, want):
    if dtype == torch.bfloat16:
        return dict(rtol=1e-2, atol=1e-2 * max(1.0, want.abs().max().item()))
    return dict(rtol=1e-5, atol=1e-5 * max(1.0, want.abs().max().item()))


def to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("m,n,k,bits,group", SHAPES)
@pytest.mark.parametrize("mins", [True, False])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_matches_reference(device, m, n, k, bits, group, mins, scale_dtype, gen):
    x, q, s, mn, b = to(device, *operands(m, n, k, bits, group, gen, mins=mins,
                                         scale_dtype=scale_dtype, bias=True))
    got = ops.quantized_linear(x, q, s, mn, b)
    want = reference.quantized_linear(x, q, s, mn, b)
    assert got.shape == (m, n) and got.dtype == x.dtype
    torch.testing.assert_close(got, want, **tolerance(x.dtype, want))


@pytest.mark.parametrize("m,n,k,bits,group", SHAPES[::2])
def test_bfloat16_activations(device, m, n, k, bits, group, gen):
    x, q, s, mn, b = to(device, *operands(m, n, k, bits, group, gen, dtype=torch.bfloat16, bias=True))
    got = ops.quantized_linear(x, q, s, mn, b)
    want = reference.quantized_linear(x, q, s, mn, b)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), **tolerance(torch.bfloat16, want.float()))


@pytest.mark.parametrize("m,n,k,bits,group", SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_every_cpu_path_matches_reference(cpu_isa, m, n, k, bits, group, scale_dtype, gen):
    x, q, s, mn, _ = operands(m, n, k, bits, group, gen, scale_dtype=scale_dtype)
    want = reference.quantized_linear(x, q, s, mn)
    torch.testing.assert_close(ops.quantized_linear(x, q, s, mn), want, **tolerance(x.dtype, want))


ROWS = 41  # crosses the 4-row tiles and the one-row path


@pytest.mark.parametrize("bits,group,k", [(4, 32, 96), (4, 64, 1536), (8, 16, 80), (8, 32, 576)])
def test_batch_invariant(cpu_isa, bits, group, k, gen):
    """Each row is bit-identical alone, in any batch and at any position."""
    x, q, s, mn, b = operands(ROWS, 67, k, bits, group, gen, bias=True)
    alone = torch.cat([ops.quantized_linear(x[i : i + 1], q, s, mn, b) for i in range(ROWS)])
    for m in (2, 3, 4, 5, 8, 9, 16, 33, ROWS):
        for start in (0, ROWS - m, (ROWS - m) // 3):
            assert torch.equal(ops.quantized_linear(x[start : start + m], q, s, mn, b),
                               alone[start : start + m]), (m, start)
    perm = torch.randperm(ROWS, generator=gen)
    assert torch.equal(ops.quantized_linear(x[perm], q, s, mn, b), alone[perm])


def test_batch_invariant_whatever_the_threads(gen):
    x, q, s, mn, _ = operands(9, 301, 256, 4, 32, gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = ops.quantized_linear(x, q, s, mn)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(ops.quantized_linear(x, q, s, mn), single)


def test_activation_quantization_reference():
    """Blocks of 32 with their own scale, the last one short, round half to even, zeros."""
    x = torch.zeros(2, 40)
    x[0, :32] = torch.linspace(-1, 1, 32)
    x[0, 32:] = 0.5
    q, scales = reference.quantize_activations(x)
    assert q.dtype == torch.int8 and scales.shape == (2, 2)
    assert q[0, 0] == -127 and q[0, 31] == 127 and (q[0, 32:] == 127).all()
    assert (q[1] == 0).all() and (scales[1] == 0).all()
    half = torch.tensor([[1.0, 0.5 / 127, 1.5 / 127]])  # exact halves round to even
    assert reference.quantize_activations(half)[0].tolist() == [[127, 0, 2]]


@pytest.mark.parametrize("k,group", [(96, 32), (80, 16), (576, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_cpu_path_quantizes_activations_as_the_reference(cpu_isa, k, group, dtype, gen):
    """One-hot int8 weights with scale 1 read each quantized activation back exactly
    (``out[m, j] = q[m, j] * scale[m, j // 32]``): every path's activation quantization is the
    reference's, round-half-even ties, zero blocks and the short last block included."""
    x = torch.randn(5, k, generator=gen) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 1.0])[:, None]
    x[3, :32] = torch.arange(-16, 16) + 0.5  # amax 15.5: not exact ties, but near them
    x[4, :] = 0.0
    x[4, 1], x[4, 2], x[4, 3], x[4, 0] = 2.5, -3.5, 0.5, 127.0  # amax 127: exact ties
    x[4, 32], x[4, 33] = 47.0, 23.5  # a tie only if 127 / 47 is divided, not reciprocated
    x = x.to(dtype)
    weights = torch.eye(k, dtype=torch.int8)
    scales = torch.ones(k, k // group)
    q, act_scales = reference.quantize_activations(x)
    want = q.float() * act_scales.repeat_interleave(32, 1)[:, :k]
    assert torch.equal(ops.quantized_linear(x, weights, scales).float(), want.to(dtype).float())


def test_leading_dims_and_empty(device, gen):
    x, q, s, mn, _ = to(device, *operands(6, 5, 64, 4, 32, gen))
    got = ops.quantized_linear(x.view(2, 3, 64), q, s, mn)
    assert got.shape == (2, 3, 5)
    assert torch.equal(got.view(6, 5), ops.quantized_linear(x, q, s, mn))
    assert ops.quantized_linear(x[:0], q, s, mn).shape == (0, 5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device, gen):
    x, q, s, mn, _ = to(device, *operands(2, 5, 64, 4, 32, gen))
    with pytest.raises(ValueError, match="qweight"):
        ops.quantized_linear(x, q[:, :31], s, mn)
    with pytest.raises(ValueError, match="int8 or uint8"):
        ops.quantized_linear(x, q.to(torch.int16), s, mn)
    with pytest.raises(ValueError, match="group"):
        ops.quantized_linear(x, q, torch.ones(5, 4, device=device), None)  # group 16 for int4
    with pytest.raises(ValueError, match="group"):
        ops.quantized_linear(x[:, :48], torch.zeros(5, 48, dtype=torch.int8, device=device),
                             torch.ones(5, 2, device=device), None)  # group 24
    with pytest.raises(ValueError, match="scales"):
        ops.quantized_linear(x, q, s[:4], mn)
    with pytest.raises(ValueError, match="mins"):
        ops.quantized_linear(x, q, s, mn[:, :1])
    with pytest.raises(ValueError, match="mins"):
        ops.quantized_linear(x, q, s, mn.half())
    with pytest.raises(ValueError, match="float32 or float16"):
        ops.quantized_linear(x, q, s.double(), None)
    with pytest.raises(ValueError, match="bias"):
        ops.quantized_linear(x, q, s, mn, torch.zeros(4, device=device))
    if device == "cpu":
        with pytest.raises(ValueError, match="float32 or bfloat16"):
            ops.quantized_linear(x.half(), q, s, mn)


def test_opcheck(device, gen):
    x, q, s, mn, b = to(device, *operands(3, 10, 96, 4, 32, gen, bias=True))
    torch.library.opcheck(torch.ops.specdec.quantized_linear.default, (x, q, s, mn, b))
    x, q, s, _, _ = to(device, *operands(3, 10, 48, 8, 16, gen))
    torch.library.opcheck(torch.ops.specdec.quantized_linear.default, (x, q, s, None, None))


def test_compile_fullgraph(gen):
    x, q, s, mn, _ = operands(4, 12, 64, 4, 32, gen)

    @torch.compile(fullgraph=True, backend="eager")
    def f(x, q, s, mn):
        return ops.quantized_linear(x, q, s, mn) * 2

    torch.testing.assert_close(f(x, q, s, mn), 2 * ops.quantized_linear(x, q, s, mn))


# ---------------------------------------------------------------------------- QuantizedWeight


def test_pack_int4_round_trip(gen):
    values = torch.randint(0, 16, (5, 96), generator=gen, dtype=torch.uint8)
    assert torch.equal(reference.unpack_int4(pack_int4(values)), values)


@pytest.mark.parametrize("bits,group,bound", [(4, 32, 0.08), (8, 16, 0.005), (4, 128, 0.12)])
def test_quantize_weight_error(bits, group, bound, gen):
    w = torch.randn(40, 256, generator=gen)
    qw = quantize_weight(w, bits, group)
    assert qw.shape == w.shape and qw.group == group
    err = (qw.dequantize() - w).abs().max() / w.abs().max()
    assert err < bound
    with pytest.raises(ValueError, match="bits"):
        quantize_weight(w, 3, 32)
    with pytest.raises(ValueError, match="group"):
        quantize_weight(w, bits, 48)


def test_quantized_weight_in_a_module(gen):
    linear = torch.nn.Linear(64, 10)
    embed = torch.nn.Embedding(10, 64)
    qw = quantize_weight(linear.weight, 4, 32)
    x = torch.randn(3, 64, generator=gen)
    want = ops.quantized_linear(x, qw.qweight, qw.scales, qw.mins, linear.bias.detach())
    quantize_model(linear, 4, 32)
    assert isinstance(linear.weight, QuantizedWeight)
    with torch.no_grad():
        assert torch.equal(linear(x), want)  # outside the routing: the kernel all the same
        with RoutedLinears(linear)():
            assert torch.equal(linear(x), want)
    ids = torch.tensor([[1, 7], [3, 1]])
    with torch.no_grad():
        rows = F.embedding(ids, qw)
    assert torch.equal(rows, qw.dequantize()[ids])
    assert qw.to("cpu") is qw and qw.to(torch.float32) is qw
    assert qw.to(torch.bfloat16).dtype == torch.bfloat16
    assert torch.equal(qw + 0, qw.dequantize())  # anything else: the dense weight
    assert resident_bytes(linear) == qw.nbytes_resident + 10 * 4
    assert resident_bytes(embed) == 10 * 64 * 4


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 16)])
def test_weights_laid_out_together_run_as_one(bits, group, gen):
    """Sibling linears put in one storage keep their values; joined, one kernel call gives
    every block's columns bit for bit; anything not laid out that way is not joined."""
    linears = [torch.nn.Linear(64, n, bias=False) for n in (24, 8, 8)]
    quantized = [quantize_weight(torch.randn(n, 64, generator=gen), bits, group) for n in (24, 8, 8)]
    for layer, weight in zip(linears, quantized):
        set_weight(layer, weight)
    assert joined_rows(quantized) is None  # separate storages
    assert lay_out_together(linears)
    for layer, weight in zip(linears, quantized):
        assert torch.equal(layer.weight.dequantize(), weight.dequantize())
    joined = joined_rows([layer.weight for layer in linears])
    assert joined.shape == (40, 64)
    x = torch.randn(5, 64, generator=gen)
    parts = ops.quantized_linear(x, joined.qweight, joined.scales, joined.mins).split([24, 8, 8], -1)
    for part, weight in zip(parts, quantized):
        assert torch.equal(part, weight.linear(x))
    assert joined_rows([linears[1].weight, linears[0].weight]) is None  # out of order
    other = quantize_weight(torch.randn(8, 64, generator=gen), 8 if bits == 4 else 4, 32)
    assert not lay_out_together([linears[0], torch.nn.Linear(64, 8)])  # a float weight
    holder = torch.nn.Linear(64, 8)
    set_weight(holder, other)
    assert not lay_out_together([linears[0], holder])  # another format


def with_and_without_vnni(script: str, tmp_path) -> list:
    """What ``script`` saves to the path it is given, run in two fresh processes from the
    repository root: with the CPU's VNNI tiles and with ``SPECDEC_CPU_VNNI=0`` (no ISA cap)."""
    import os
    import subprocess
    import sys

    results = []
    for vnni in ("1", "0"):
        path = tmp_path / f"vnni{vnni}.pt"
        env = dict(os.environ, SPECDEC_CPU_VNNI=vnni)
        env.pop("SPECDEC_CPU_ISA", None)
        subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True,
                       timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        results.append(torch.load(path))
    return results


_VNNI_SCRIPT = r"""
import sys, torch
from specdec_kernels import ops
gen = torch.Generator().manual_seed(5)
out = {}
for isa in ("avx2", "avx512"):
    if ops.cpu_isa(isa) != isa:
        continue
    for bits, k, n in ((4, 320, 37), (8, 192, 29)):
        x = torch.randn(6, k, generator=gen)
        if bits == 4:
            q = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
        else:
            q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        scales = torch.rand(n, k // 32, generator=gen) * 0.01
        mins = torch.randn(n, k // 32, generator=gen) * 0.01 if bits == 4 else None
        out[f"{isa}-int{bits}"] = ops.quantized_linear(x, q, scales, mins)
torch.save(out, sys.argv[1])
"""


def test_vnni_tiles_give_the_bits_of_the_tiles_without(tmp_path):
    """The VNNI tiles (AVX-512 VNNI's and AVX-VNNI's vpdpbusd) and the tiles without them
    (vpmaddubsw + vpmaddwd) form the same exact integer sums, so each ISA path gives the same
    bits whichever the CPU runs: two processes, one with ``SPECDEC_CPU_VNNI=0``. (On a CPU
    without VNNI both run the same tiles.)"""
    with_vnni, without = with_and_without_vnni(_VNNI_SCRIPT, tmp_path)
    if not with_vnni:
        pytest.skip("this CPU has no AVX2")
    assert with_vnni.keys() == without.keys()
    for key in with_vnni:
        assert torch.equal(with_vnni[key], without[key]), key
