"""quantized_linear's panel layout, int4 and int8 (also in groups of 16: GGUF Q6_K's
sub-blocks) (csrc/cpu_qpanel.h): the packing and its
inverse, the kernel against the reference on every CPU path, the same bits on every path and in any batch,
bad input, opcheck; QuantizedWeight holding panels inside models."""

import pytest
import torch
import torch.nn.functional as F

from python_tests.conftest import DEVICES
from python_tests.test_quantized_linear import tolerance, with_and_without_vnni
from specdec_kernels import ops, reference
from specdec_kernels.models.quantized_weight import (
    KQuantScales,
    QuantizedWeight,
    joined_rows,
    lay_out_together,
    pack_model_panels,
    pack_panels,
    quantize_model,
    quantize_weight,
    resident_bytes,
    set_weight,
)

# (M, N, K): N a multiple of 16 (the panel), K of 32 (the group); M crossing the 8-row
# (AVX-512) and 4-row (AVX2, portable) tiles.
SHAPES = [(1, 16, 32), (3, 48, 96), (5, 160, 576), (9, 32, 1536), (17, 16, 64), (2, 80, 352)]


def panel_operands(m, n, k, gen, *, bits=4, group=32, mins=True, scale_dtype=torch.float32,
                   dtype=torch.float32, bias=False):
    """Random operands in the row layout and the same weight in panels (groups of 16: int8,
    no mins)."""
    x = torch.randn(m, k, generator=gen).to(dtype)
    if bits == 4:
        q = torch.randint(0, 256, (n, k // 2), generator=gen).to(torch.uint8)
    else:
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.05).to(scale_dtype)
    mins = mins and group == 32
    mn = (torch.randn(n, k // group, generator=gen) * 0.05).to(scale_dtype) if mins else None
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    packed = pack_panels(QuantizedWeight(q, scales, mn, dtype=dtype))
    assert packed.qweight.dim() == 3
    return x, (q, scales, mn), (packed.qweight, packed.scales, packed.mins), b


BITS = pytest.mark.parametrize("bits", [4, 8])
#: Every panel kind: int4 and int8 in groups of 32, int8 in groups of 16.
KINDS = pytest.mark.parametrize("bits,group", [(4, 32), (8, 32), (8, 16)])


@KINDS
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (32, 1536)])
@pytest.mark.parametrize("mins", [True, False])
def test_pack_and_unpack_are_inverse(bits, group, n, k, mins, gen):
    """The panels hold the row layout's bytes, scales and mins, moved: byte 64 j + 4 r + i of
    (panel p, block b) is byte 4 j + i of row 16 p + r's block b; in groups of 16, scale
    16 h + r of (p, b) is row 16 p + r's scale of half h."""
    _, rows, panels, _ = panel_operands(1, n, k, gen, bits=bits, group=group, mins=mins)
    block_bytes = 256 if bits == 4 else 512
    scales_per_block = 16 * 32 // group
    assert panels[0].shape == (n // 16, k // 32, block_bytes)
    assert panels[1].shape == (n // 16, k // 32, scales_per_block)
    if group == 16:
        p, b = n // 16 - 1, k // 32 - 1
        assert panels[1][p, b, 16 + 5] == rows[1][16 * p + 5, 2 * b + 1]
    back = reference.unpack_panels(*panels)
    for got, want in zip(back, rows):
        assert (got is None and want is None) or torch.equal(got, want)
    q, packed = rows[0], panels[0]
    p, b = n // 16 - 1, k // 32 - 1  # the last panel and block: j = 3, r = 5, i = 1
    assert packed[p, b, 64 * 3 + 4 * 5 + 1] == q[16 * p + 5, block_bytes // 16 * b + 4 * 3 + 1]
    assert torch.equal(reference.dequantize_weight(*panels), reference.dequantize_weight(*rows))


@pytest.mark.parametrize("bits,group,mins", [(4, 32, True), (4, 32, False), (8, 32, True),
                                              (8, 32, False), (8, 16, False)])
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16])
def test_every_cpu_path_matches_reference(cpu_isa, bits, group, m, n, k, mins, scale_dtype, gen):
    x, _, panels, b = panel_operands(m, n, k, gen, bits=bits, group=group, mins=mins,
                                     scale_dtype=scale_dtype, bias=True)
    got = ops.quantized_linear(x, *panels, b)
    want = reference.quantized_linear(x, *panels, b)
    assert got.shape == (m, n) and got.dtype == x.dtype
    torch.testing.assert_close(got, want, **tolerance(x.dtype, want))


@KINDS
@pytest.mark.parametrize("m,n,k", SHAPES[::2])
def test_bfloat16_activations(bits, group, m, n, k, gen):
    x, _, panels, b = panel_operands(m, n, k, gen, bits=bits, group=group, dtype=torch.bfloat16,
                                     bias=True)
    got = ops.quantized_linear(x, *panels, b)
    want = reference.quantized_linear(x, *panels, b)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), **tolerance(torch.bfloat16, want.float()))


@KINDS
def test_every_cpu_path_gives_the_same_bits(bits, group, gen):
    """Exact integer sums, then the same fused float operations in the same order: the
    portable, AVX2 and AVX-512 paths agree bit for bit (unlike the row layout's)."""
    x, _, panels, b = panel_operands(11, 96, 608, gen, bits=bits, group=group, bias=True)
    xh, _, half_panels, _ = panel_operands(3, 32, 96, gen, bits=bits, group=group,
                                           scale_dtype=torch.float16)
    results = {}
    try:
        for isa in ("portable", "avx2", "avx512"):
            if ops.cpu_isa(isa) == isa:
                results[isa] = (ops.quantized_linear(x, *panels, b), ops.quantized_linear(xh, *half_panels))
    finally:
        ops.cpu_isa("none")
    assert "portable" in results
    for isa, (got, got_half) in results.items():
        assert torch.equal(got, results["portable"][0]), isa
        assert torch.equal(got_half, results["portable"][1]), isa


ROWS = 41


@KINDS
@pytest.mark.parametrize("k", [96, 1536])
def test_batch_invariant(cpu_isa, bits, group, k, gen):
    """Each row is bit-identical alone, in any batch and at any position."""
    x, _, panels, b = panel_operands(ROWS, 64, k, gen, bits=bits, group=group, bias=True)
    alone = torch.cat([ops.quantized_linear(x[i : i + 1], *panels, b) for i in range(ROWS)])
    for m in (2, 3, 4, 5, 8, 9, 16, 17, 33, ROWS):
        for start in (0, ROWS - m, (ROWS - m) // 3):
            assert torch.equal(ops.quantized_linear(x[start : start + m], *panels, b),
                               alone[start : start + m]), (m, start)
    perm = torch.randperm(ROWS, generator=gen)
    assert torch.equal(ops.quantized_linear(x[perm], *panels, b), alone[perm])


@pytest.mark.parametrize("m,k", [(9, 256), (97, 576)])
def test_batch_invariant_whatever_the_threads(m, k, gen):
    """The same bits on 1 and on several threads; 97 rows of 576 are 1746 blocks of x, so their
    quantization is split over the threads too (each thread must quantize into the caller's
    rows: a thread-local buffer named inside the parallel loop would be each worker's own)."""
    x, _, panels, _ = panel_operands(m, 304, k, gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = ops.quantized_linear(x, *panels)
        torch.set_num_threads(max(threads, 2))
        several = ops.quantized_linear(x, *panels)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(several, single)
    want = reference.quantized_linear(x, *panels)
    torch.testing.assert_close(single, want, **tolerance(x.dtype, want))


def test_leading_dims_and_empty(gen):
    x, _, panels, _ = panel_operands(6, 32, 64, gen)
    got = ops.quantized_linear(x.view(2, 3, 64), *panels)
    assert got.shape == (2, 3, 32)
    assert torch.equal(got.view(6, 32), ops.quantized_linear(x, *panels))
    assert ops.quantized_linear(x[:0], *panels).shape == (0, 32)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device, gen):
    x, _, (q, s, mn), _ = panel_operands(2, 32, 64, gen)
    x, q, s, mn = (t.to(device) for t in (x, q, s, mn))
    if device != "cpu":
        with pytest.raises(ValueError, match="CPU-only"):
            ops.quantized_linear(x, q, s, mn)
        return
    with pytest.raises(ValueError, match="panel layout"):
        ops.quantized_linear(x, q.to(torch.int8), s, mn)
    with pytest.raises(ValueError, match="panel layout"):
        ops.quantized_linear(x, q[:, :, :128], s, mn)
    with pytest.raises(ValueError, match="panel layout"):  # int8 panels are 512 bytes a block
        ops.quantized_linear(x, q.view(torch.int8), s, mn)
    with pytest.raises(ValueError, match="K / 32"):
        ops.quantized_linear(x[:, :32], q, s, mn)
    with pytest.raises(ValueError, match="scales must have shape"):
        ops.quantized_linear(x, q, s[:1], mn)
    with pytest.raises(ValueError, match="scales must have shape"):
        ops.quantized_linear(x, q, s.reshape(2, 32), mn)
    with pytest.raises(ValueError, match="mins"):
        ops.quantized_linear(x, q, s, mn[:, :, :8])
    with pytest.raises(ValueError, match="mins"):
        ops.quantized_linear(x, q, s, mn.half())
    with pytest.raises(ValueError, match="float32 or float16"):
        ops.quantized_linear(x, q, s.double(), None)
    with pytest.raises(ValueError, match="bias"):
        ops.quantized_linear(x, q, s, mn, torch.zeros(16))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        ops.quantized_linear(x.half(), q, s, mn)
    with pytest.raises(ValueError, match="qweight"):
        ops.quantized_linear(x, q.view(1, 2, 2, 256), s, mn)
    # Groups of 16: int8 only, without mins.
    with pytest.raises(ValueError, match="scales must have shape"):
        ops.quantized_linear(x, q, torch.cat([s, s], -1), None)
    x8, _, (q8, s8, _), _ = panel_operands(2, 32, 64, gen, bits=8, group=16)
    assert s8.shape == (2, 2, 32)
    with pytest.raises(ValueError, match="take no mins"):
        ops.quantized_linear(x8, q8, s8, s8)


@KINDS
def test_opcheck(bits, group, gen):
    x, _, panels, b = panel_operands(3, 32, 96, gen, bits=bits, group=group, bias=True)
    torch.library.opcheck(torch.ops.specdec.quantized_linear.default, (x, *panels, b))


# ---------------------------------------------------------------------------- QuantizedWeight


def test_what_fits_the_panels(gen):
    """Group 32 (int8 also 16) with N a multiple of 16 and K of 32 is packed; anything else
    is left as it is."""
    for bits, group in ((4, 32), (8, 32), (8, 16)):
        weight = quantize_weight(torch.randn(32, 64, generator=gen), bits, group)
        assert pack_panels(weight).qweight.dim() == 3
    for weight in (quantize_weight(torch.randn(24, 64, generator=gen), 4, 32),  # N
                   quantize_weight(torch.randn(32, 128, generator=gen), 4, 64),  # group
                   quantize_weight(torch.randn(32, 48, generator=gen), 8, 16)):  # K
        assert pack_panels(weight) is weight


@BITS
def test_panel_weight_in_a_module(bits, gen):
    linear = torch.nn.Linear(64, 48)
    rows = quantize_weight(linear.weight, bits, 32)
    quantize_model(linear, bits, 32)
    qw = linear.weight
    assert isinstance(qw, QuantizedWeight) and qw.qweight.dim() == 3
    assert qw.shape == rows.shape and qw.group == 32 and qw.nbytes_resident == rows.nbytes_resident
    assert torch.equal(qw.dequantize(), rows.dequantize())
    x = torch.randn(3, 64, generator=gen)
    with torch.no_grad():
        assert torch.equal(linear(x), ops.quantized_linear(x, qw.qweight, qw.scales, qw.mins,
                                                           linear.bias.detach()))
    ids = torch.tensor([[1, 47], [17, 1]])
    with torch.no_grad():
        assert torch.equal(F.embedding(ids, qw), rows.dequantize()[ids])
    assert qw.to("cpu") is qw and qw.to(torch.bfloat16).dtype == torch.bfloat16
    assert resident_bytes(linear) == rows.nbytes_resident + 48 * 4


@KINDS
def test_rows_of_a_panel_weight_are_the_row_layouts(bits, group, gen):
    """Gathering rows (an embedding lookup) from panels reads each row's bytes and scales where
    the packing put them, in every kind."""
    rows = quantize_weight(torch.randn(48, 96, generator=gen), bits, group)
    panels = pack_panels(rows)
    assert panels.qweight.dim() == 3 and panels.group == group
    ids = torch.tensor([[0, 47, 17], [16, 5, 31]])
    assert torch.equal(F.embedding(ids, panels), rows.dequantize()[ids])
    assert torch.equal(panels.dequantize(), rows.dequantize())


def test_pack_model_panels_keeps_ties(gen):
    first, second = torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(64, 32, bias=False)
    shared = quantize_weight(torch.randn(32, 64, generator=gen), 4, 32)
    set_weight(first, shared)
    set_weight(second, shared)
    holder = torch.nn.Sequential(first, second)
    assert pack_model_panels(holder) == 1
    assert first.weight is second.weight and first.weight.qweight.dim() == 3
    assert pack_model_panels(holder) == 0  # already packed


def test_panel_weights_laid_out_together_run_as_one(gen):
    """Sibling linears in panels joined in one storage: one call gives every block's columns
    bit for bit."""
    linears = [torch.nn.Linear(64, n, bias=False) for n in (32, 16, 16)]
    quantized = [pack_panels(quantize_weight(torch.randn(n, 64, generator=gen), 4, 32)) for n in (32, 16, 16)]
    for layer, weight in zip(linears, quantized):
        set_weight(layer, weight)
    assert lay_out_together(linears)
    joined = joined_rows([layer.weight for layer in linears])
    assert joined.shape == (64, 64) and joined.qweight.shape == (4, 2, 256)
    x = torch.randn(5, 64, generator=gen)
    parts = ops.quantized_linear(x, joined.qweight, joined.scales, joined.mins).split([32, 16, 16], -1)
    for part, weight in zip(parts, quantized):
        assert torch.equal(part, weight.linear(x))
    holder = torch.nn.Linear(64, 16, bias=False)
    set_weight(holder, quantize_weight(torch.randn(16, 64, generator=gen), 4, 32))  # rows
    assert not lay_out_together([linears[0], holder])  # another layout


_VNNI_SCRIPT = r"""
import sys, torch
from specdec_kernels import ops
from python_tests.test_quantized_panels import panel_operands
gen = torch.Generator().manual_seed(5)
out = []
for bits, group in ((4, 32), (8, 32), (8, 16)):
    x, _, panels, _ = panel_operands(6, 48, 320, gen, bits=bits, group=group)
    out.append(ops.quantized_linear(x, *panels))
torch.save(out, sys.argv[1])
"""


def test_vnni_gives_the_bits_of_the_path_without(tmp_path):
    """vpdpbusd and vpmaddubsw + vpmaddwd form the same exact sums: one process with
    ``SPECDEC_CPU_VNNI=0`` gets the other's bits."""
    for with_vnni, without in zip(*with_and_without_vnni(_VNNI_SCRIPT, tmp_path)):
        assert torch.equal(with_vnni, without)


# ---------------------------------------------------------------------------- K-quant scales


def kquant_weight(n, k, gen, *, bits, group):
    """A row-layout weight whose scales (and mins, int4) factor as a K-quant file's: int8
    sub-scales times one float16 d (dmin) per row and 256 values; float32 scales as the GGUF
    repacker computes them."""
    sub = torch.randint(-64 if bits == 8 else 0, 64, (n, k // group), generator=gen).to(torch.int8)
    d = (torch.rand(n, k // 256, generator=gen) * 1e-2).half()
    scales = d.float().repeat_interleave(256 // group, dim=1) * sub.float()
    if bits == 8:
        q = torch.randint(-32, 32, (n, k), generator=gen).to(torch.int8)
        return QuantizedWeight(q, scales, kquant=KQuantScales(sub, d))
    q = torch.randint(0, 256, (n, k // 2), generator=gen).to(torch.uint8)
    sub_mins = torch.randint(0, 64, (n, k // group), generator=gen).to(torch.int8)
    dmin = (torch.rand(n, k // 256, generator=gen) * 1e-2).half()
    mins = -(dmin.float().repeat_interleave(256 // group, dim=1) * sub_mins.float())
    return QuantizedWeight(q, scales, mins, kquant=KQuantScales(sub, d, sub_mins, dmin))


def float_panels(weight):
    """The same weight packed with its float32 scales (its factors dropped)."""
    return pack_panels(QuantizedWeight(weight.qweight, weight.scales, weight.mins, dtype=weight.dtype))


KQUANTS = pytest.mark.parametrize("bits,group", [(4, 32), (8, 16), (8, 32)])  # Q4_K, Q6_K, Q5_K


@KQUANTS
@pytest.mark.parametrize("n,k", [(16, 256), (48, 512), (160, 1536)])
def test_kquant_scales_give_the_float_scales_bits(cpu_isa, bits, group, n, k, gen):
    """The file's factors, multiplied in the tile, are the float32 scales exactly: every row
    count, the same bits as the float panels, in a sixth of the scale bytes."""
    weight = kquant_weight(n, k, gen, bits=bits, group=group)
    compact, plain = pack_panels(weight), float_panels(weight)
    entries = 16 * 32 // group
    assert compact.scales.dtype == torch.int8 and compact.scales.shape == (n // 16, k // 256, 8 * entries + 32)
    assert compact.group == group
    assert compact.nbytes_resident < plain.nbytes_resident
    assert torch.equal(reference.expand_kquant_scales(compact.scales), plain.scales)
    if bits == 4:
        assert torch.equal(reference.expand_kquant_scales(compact.mins, negate=True), plain.mins)
    for m in (1, 3, 9, 17, 40):  # past 2 row tiles a panel's scales are expanded once
        x = torch.randn(m, k, generator=gen)
        got = ops.quantized_linear(x, compact.qweight, compact.scales, compact.mins)
        assert torch.equal(got, ops.quantized_linear(x, plain.qweight, plain.scales, plain.mins)), m


@KQUANTS
def test_kquant_panel_rows_and_dequantization(bits, group, gen):
    weight = kquant_weight(48, 512, gen, bits=bits, group=group)
    compact = pack_panels(weight)
    dense = weight.dequantize()
    assert torch.equal(compact.dequantize(), dense)
    ids = torch.tensor([[0, 47, 17], [16, 5, 31]])
    assert torch.equal(F.embedding(ids, compact), dense[ids])
    x = torch.randn(3, 512, generator=gen)
    torch.testing.assert_close(compact.linear(x), reference.quantized_linear(
        x, compact.qweight, compact.scales, compact.mins), **tolerance(x.dtype, x @ dense.T))
    torch.library.opcheck(torch.ops.specdec.quantized_linear.default,
                          (x, compact.qweight, compact.scales, compact.mins, None))


def test_kquant_scales_bad_input(gen):
    weight = kquant_weight(32, 512, gen, bits=4, group=32)
    compact = pack_panels(weight)
    x = torch.randn(2, 512, generator=gen)
    q, s, mn = compact.qweight, compact.scales, compact.mins
    with pytest.raises(ValueError, match="K-quant"):
        ops.quantized_linear(x, q, s[:, :1], mn[:, :1])
    with pytest.raises(ValueError, match="K-quant"):
        ops.quantized_linear(x, q, s[..., :128], mn[..., :128])
    with pytest.raises(ValueError, match="row layout takes float32 or float16"):
        ops.quantized_linear(x, weight.qweight, weight.scales.to(torch.int8), None)
    with pytest.raises(ValueError, match="mins"):
        ops.quantized_linear(x, q, s, mn.float())
    # K not a multiple of 256: not a K-quant; its factors are not packed.
    odd = QuantizedWeight(weight.qweight[:, :96], weight.scales[:, :6], weight.mins[:, :6],
                          kquant=weight.kquant)
    assert pack_panels(odd).scales.dtype == torch.float32
