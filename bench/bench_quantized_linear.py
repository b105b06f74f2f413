"""quantized_linear (weights at a GGUF file's precision) against small_batch_linear on the
same layer in float32, per CPU instruction set (pytest-benchmark).

    python3 -m pytest bench/bench_quantized_linear.py --benchmark-columns=median
    python3 -m bench -k quantized_linear

Shapes: the default model's LM head (49152 x 576, Q8_0 in its file, here also int4) and MLP
(1536 x 576, Q4_1), and a 1.5B-class MLP (8960 x 1536, Q4_K: int4, group 32 with mins). M = 1
(decoding) and M = 8 (verifying 8 tokens). extra_info["GB/s"]: the bytes the weights occupy
(values, scales, mins) over the median time: at M = 1 the kernel should stream them at the
machine's bandwidth (36.8 GB/s read on the 2-core Zen 4 of bench/RESULTS.md).
`test_quantized_linear_from_memory` makes each call read another copy of the weight (64 MB of
copies, past the last-level cache), as a decoding step does: that is where the tiles' prefetch
of the next weight tile shows.
"""

import itertools

import pytest
import torch

from bench.conftest import record_bandwidth
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight

SHAPES = {"lm-head-135m": (49152, 576), "mlp-135m": (1536, 576), "mlp-1.5b": (8960, 1536)}
FORMATS = {"int4-g32": (4, 32), "int8-g32": (8, 32)}
ISAS = ["avx512_bf16", "avx2"]


@pytest.fixture(params=ISAS)
def isa(request):
    got = ops.cpu_isa(request.param)
    try:
        if got != request.param:
            pytest.skip(f"this CPU has no {request.param}")
        yield got
    finally:
        ops.cpu_isa("none")


def weights(shape):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=gen) * 0.02


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_quantized_linear(benchmark, isa, shape, fmt, rows):
    qw = quantize_weight(weights(SHAPES[shape]), *FORMATS[fmt])
    x = torch.randn(rows, SHAPES[shape][1])
    benchmark.group = f"linear {shape} M={rows} {isa}"
    benchmark(lambda: ops.quantized_linear(x, qw.qweight, qw.scales, qw.mins))
    record_bandwidth(benchmark, qw.nbytes_resident)


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_float32_baseline(benchmark, isa, shape, rows):
    w = weights(SHAPES[shape])
    x = torch.randn(rows, SHAPES[shape][1])
    benchmark.group = f"linear {shape} M={rows} {isa}"
    benchmark(lambda: ops.small_batch_linear(x, w))
    record_bandwidth(benchmark, w.numel() * 4)


@pytest.mark.parametrize("shape, fmt", [("mlp-135m", "int4-g32"), ("lm-head-135m", "int8-g32")])
def test_quantized_linear_from_memory(benchmark, isa, shape, fmt):
    base = quantize_weight(weights(SHAPES[shape]), *FORMATS[fmt])
    copies = max(2, -(-64 * 2**20 // base.nbytes_resident))
    cycle = itertools.cycle([(base.qweight.clone(), base.scales.clone(),
                              None if base.mins is None else base.mins.clone()) for _ in range(copies)])
    x = torch.randn(1, SHAPES[shape][1])
    benchmark.group = f"linear {shape} M=1 from memory {isa}"
    benchmark(lambda: ops.quantized_linear(x, *next(cycle)))
    record_bandwidth(benchmark, base.nbytes_resident)
