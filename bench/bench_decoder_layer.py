"""The decoder-layer ops against the torch expressions they replace (pytest-benchmark): the
dispatch they save at batch 1 is the point, so the shapes are a decoding step's.

    python3 -m pytest bench/bench_decoder_layer.py --benchmark-columns=median
    python3 -m bench -k decoder_layer

Shapes: the default model's hidden size (576), its 9 + 3 heads of 64 (q and k rotated
together) and its MLP width (1536), for 1 row (decoding) and 16 (verifying a tree).
"""

import pytest
import torch

from specdec_kernels import ops, reference

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 576, 12, 64, 1536


def operands(rows):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, rows, HIDDEN, generator=gen)
    residual = torch.randn(1, rows, HIDDEN, generator=gen)
    weight = torch.rand(HIDDEN, generator=gen) + 0.5
    qk = torch.randn(1, rows, HEADS, HEAD_DIM, generator=gen)
    angle = torch.rand(1, rows, HEAD_DIM, generator=gen)
    gate_up = torch.randn(1, rows, 2 * INTERMEDIATE, generator=gen)
    return x, residual, weight, qk, angle.cos(), angle.sin(), gate_up


def calls(rows, kind):
    """One decoder layer's glue (two norms after residual adds, the rotary embedding of q and
    k, the SiLU gate) through the ops or through torch."""
    x, residual, weight, qk, cos, sin, gate_up = operands(rows)
    gate, up = gate_up[..., :INTERMEDIATE], gate_up[..., INTERMEDIATE:]
    if kind == "ops":
        return lambda: (ops.add_rms_norm(x, residual, weight, 1e-5),
                        ops.rotary_embedding(qk, cos, sin), ops.silu_mul(gate, up))
    return lambda: (reference.add_rms_norm(x, residual, weight, 1e-5),
                    reference.rotary_embedding(qk, cos, sin), reference.silu_mul(gate, up))


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("kind", ["ops", "torch"])
def test_decoder_layer_glue(benchmark, rows, kind):
    run = calls(rows, kind)
    with torch.inference_mode():
        benchmark(run)
