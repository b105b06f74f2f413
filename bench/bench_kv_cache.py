"""KV-cache compaction: the fused op vs the reference (per-layer index_select + copy), and on a
GPU the achieved bandwidth against a plain device copy of the same bytes.

Shapes follow real models: SmolLM2-135M (30 layers, 3 KV heads, head dim 64) and a 7B-class
model (32 layers, 8 KV heads, head dim 128); B requests each keep up to 8 accepted rows.
"""

import pytest
import torch

from bench.conftest import record_bandwidth, synchronized
from specdec_kernels import ops, reference

MODELS = {"smollm2-135m": (30, 3, 64), "7b-class": (32, 8, 128)}
CAPACITY = 1024
ACCEPTED = 8


def make_case(model, batch, device, dtype=torch.float16):
    layers, heads, head_dim = MODELS[model]
    stacked = torch.randn(layers, 2, batch, heads, CAPACITY, head_dim, device=device, dtype=dtype)
    start = torch.full((batch,), 500, device=device)
    # The accepted path of a tree: increasing, sparse positions after the committed prefix.
    positions = (500 + torch.arange(ACCEPTED, device=device) * 3).repeat(batch, 1)
    counts = torch.full((batch,), ACCEPTED, device=device)
    moved = 2 * stacked[:, :, :, :, :ACCEPTED].numel() * stacked.element_size()  # read + write
    return stacked, start, positions, counts, moved


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("impl", ["op", "reference"])
def test_compact_kv_cache(benchmark, device, model, batch, impl):
    stacked, start, positions, counts, moved = make_case(model, batch, device)
    lens = start.clone()
    compact = ops.compact_kv_cache_ if impl == "op" else reference.compact_kv_cache_

    def run():
        lens.copy_(start)  # same rows every round
        compact(stacked, lens, positions, counts)

    benchmark.group = f"compact_kv_cache {model} B={batch} {device}"
    benchmark(synchronized(run, device))
    record_bandwidth(benchmark, moved)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 8])
def test_device_copy_same_bytes(benchmark, device, model, batch):
    """The bandwidth ceiling the compaction is judged against: one contiguous copy."""
    *_, moved = make_case(model, batch, device)
    src = torch.empty(moved // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    benchmark.group = f"compact_kv_cache {model} B={batch} {device}"
    benchmark(synchronized(lambda: dst.copy_(src), device))
    record_bandwidth(benchmark, moved)


@pytest.mark.parametrize("impl", ["op", "reference"])
def test_compact_paged_kv_cache(benchmark, device, impl):
    layers, heads, head_dim = MODELS["7b-class"]
    batch, block_size, max_blocks = 8, 16, 64
    caches = torch.randn(
        layers, 2, batch * max_blocks, block_size, heads, head_dim, device=device, dtype=torch.float16
    )
    tables = torch.randperm(batch * max_blocks, device=device).view(batch, max_blocks)
    start = torch.full((batch,), 500, device=device)
    positions = (500 + torch.arange(ACCEPTED, device=device) * 3).repeat(batch, 1)
    counts = torch.full((batch,), ACCEPTED, device=device)
    lens = start.clone()
    compact = ops.compact_paged_kv_cache_ if impl == "op" else reference.compact_paged_kv_cache_

    def run():
        lens.copy_(start)
        compact(caches, tables, lens, positions, counts)

    benchmark.group = f"compact_paged_kv_cache 7b-class B={batch} {device}"
    benchmark(synchronized(run, device))
    record_bandwidth(benchmark, 2 * layers * 2 * batch * ACCEPTED * heads * head_dim * 2)
