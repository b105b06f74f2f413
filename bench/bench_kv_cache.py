"""KV-cache compaction: the fused op vs the reference (per-layer index_select + copy), and on a
GPU the achieved bandwidth against a plain device copy of the same bytes.

Shapes follow real models: SmolLM2-135M (30 layers, 3 KV heads, head dim 64) and a 7B-class
model (32 layers, 8 KV heads, head dim 128); B requests each keep up to 8 accepted rows. On CUDA
the op and the copy are timed eagerly (host work included: the op checks 64 cache tensors'
shapes, strides and overlap on the host, and makes no host copy) and replayed from a CUDA graph
(device time only, what the GPU target is about: compact_kv_cache_ >= 70% of the copy's
bandwidth).

CUDA estimates (H100 SXM, 3.35 TB/s, not yet measured; derivation in bench/RESULTS.md, "CUDA
estimates (not yet measured)"). Bytes = every accepted row read once and written once:

| case | bytes | kernel | expected (graph replay) |
|---|---:|---|---|
| 7b-class B=8 | 16.8 MB (5.0 µs at 3.35 TB/s) | 65,536 threads (512 CTAs, one wave), 8 x 16 B loads each in flight | ~8-9 µs with the cache_lens update: 65-75% of a same-bytes copy (~6 µs) |
| 7b-class B=1 | 2.1 MB (0.6 µs) | 8,192 threads (64 CTAs) | ~4 µs, latency and two launches: ~50-60% of the copy |
| smollm2-135m B=8 | 2.9 MB (0.9 µs) | 11,520 threads (90 CTAs) | ~4 µs: ~50-60% |
| smollm2-135m B=1 | 0.37 MB | 1,440 threads | ~3.5 µs: launch-bound, like the copy |
| paged 7b-class B=8, 16-token blocks | 16.8 MB | as contiguous, one block-table read per row | ~9-10 µs: 60-70% |
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


def timed(run, device, mode):
    """`run` as benchmarks call it: eagerly (synchronised after each call), or on CUDA as one
    captured graph replayed per call (device time without host work)."""
    if mode == "eager":
        return synchronized(run, device)
    run()  # warm up outside capture (allocations, kernel attributes)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    return replay


def modes(device, impl="op"):
    return ["eager", "graph"] if device == "cuda" and impl == "op" else ["eager"]


CASES = [(model, batch, impl, mode) for model in sorted(MODELS) for batch in (1, 8)
         for impl in ("op", "reference") for mode in ("eager", "graph")]


@pytest.mark.parametrize("model,batch,impl,mode", CASES)
def test_compact_kv_cache(benchmark, device, model, batch, impl, mode):
    if mode not in modes(device, impl):
        pytest.skip("graph replay: CUDA only, and the reference reads counts on the host")
    stacked, start, positions, counts, moved = make_case(model, batch, device)
    lens = start.clone()
    compact = ops.compact_kv_cache_ if impl == "op" else reference.compact_kv_cache_

    def run():
        lens.copy_(start)  # same rows every round
        compact(stacked, lens, positions, counts)

    benchmark.group = f"compact_kv_cache {model} B={batch} {device} {mode}"
    benchmark(timed(run, device, mode))
    record_bandwidth(benchmark, moved)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_device_copy_same_bytes(benchmark, device, model, batch, mode):
    """The bandwidth ceiling the compaction is judged against: one contiguous copy."""
    if mode not in modes(device):
        pytest.skip("graph replay: CUDA only")
    *_, moved = make_case(model, batch, device)
    src = torch.empty(moved // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    benchmark.group = f"compact_kv_cache {model} B={batch} {device} {mode}"
    benchmark(timed(lambda: dst.copy_(src), device, mode))
    record_bandwidth(benchmark, moved)


@pytest.mark.parametrize("impl,mode", [("op", "eager"), ("op", "graph"), ("reference", "eager")])
def test_compact_paged_kv_cache(benchmark, device, impl, mode):
    if mode not in modes(device, impl):
        pytest.skip("graph replay: CUDA only")
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

    benchmark.group = f"compact_paged_kv_cache 7b-class B={batch} {device} {mode}"
    benchmark(timed(run, device, mode))
    record_bandwidth(benchmark, 2 * layers * 2 * batch * ACCEPTED * heads * head_dim * 2)
