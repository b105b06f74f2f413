"""Microbenchmarks of the tree ops (pytest-benchmark).

    python3 -m pytest bench/bench_tree.py                  # CPU (and CUDA when available)
    python3 -m pytest bench/bench_tree.py -k cuda --benchmark-columns=median,min

tree_attention is compared with what Hugging Face does for a tree forward: SDPA over
``[prefix + tree]`` with a dense 4-D mask (K/V repeated per query head for GQA, since HF does not
use SDPA's GQA mode when a mask is given). Masks are built once outside the timed region, as a
model builds them once per forward for all layers. Shape: 32 query heads, 8 KV heads, head dim
128 (a Llama-style 7-8B layer); fp16 on CUDA, fp32 on CPU; one request, and on CUDA also 32
(test_tree_attention_batch). On CUDA each case is timed eagerly (launch overhead included; the op
makes no host copy) and replayed from a CUDA graph (kernel time only). GPU targets: B = 1,
prefix 2048, T = 64: tree_attention >= 3x the SDPA baseline; B = 32, same shape: >= 60% of HBM
bandwidth (extra_info GB/s; bytes = K/V of prefix + tree read once, Q read, output written).

CUDA estimates (H100 SXM: 132 SMs, 3.35 TB/s, not yet measured; derivation in
bench/RESULTS.md, "CUDA estimates (not yet measured)"):

| case | bytes | FLOPs | grid | expected |
|---|---:|---:|---|---|
| B=32, prefix 2048, T=64 | 310 MB (92.6 µs at 3.35 TB/s) | 70.9 G | 512 CTAs of 128 rows, 1 split, 1.94 waves at 2 CTAs/SM | 200-280 µs: 33-46% of HBM bandwidth (compute-bound on mma.sync; 60% needs >= 460 TFLOP/s, i.e. wgmma) |
| B=1, prefix 2048, T=64 | 9.7 MB (2.9 µs) | 2.2 G | 16 CTAs x 16 splits = 256 (one wave), 14 splits used | ~15 µs with the combine; SDPA dense mask ~55-65 µs: 3.5-4.5x |
"""

import pytest
import torch

import specdec_kernels
from bench.conftest import record_bandwidth
from specdec_kernels import ops, reference
from specdec_kernels.models.hf_masks import tree_attention_mask_4d
from specdec_kernels.tree import stack_trees, tree_from_parents

DEVICES = ["cpu"]
if torch.cuda.is_available() and specdec_kernels.has_cuda_kernels():
    DEVICES.append("cuda")

PREFIXES = [512, 2048, 8192]
TREE_SIZES = [8, 64]
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def random_tree(num_nodes, gen):
    parents = [-1] + [int(torch.randint(max(0, j - 4), j, (1,), generator=gen)) for j in range(1, num_nodes)]
    return tree_from_parents(parents)


def make_inputs(device, prefix, nodes, batch=1):
    gen = torch.Generator().manual_seed(0)
    dtype = torch.float16 if device == "cuda" else torch.float32
    _, parents = stack_trees([random_tree(nodes, gen) for _ in range(batch)])
    lens = torch.full((batch,), prefix)
    masks = reference.build_tree_masks(parents, lens)
    shape = (batch, KV_HEADS, prefix + nodes, HEAD_DIM)
    q = torch.randn(batch, nodes, Q_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    k = torch.randn(shape, generator=gen).to(device, dtype)
    v = torch.randn(shape, generator=gen).to(device, dtype)
    prefix_valid = torch.ones(batch, prefix, dtype=torch.bool)
    dense = tree_attention_mask_4d(masks.mask, prefix_valid).to(device)
    return q, k, v, lens.to(device), masks.packed_mask.to(device), dense


def attention_bytes(q, k, v):
    """The fewest bytes tree_attention moves: K/V of prefix + tree once, Q, the output."""
    return 2 * q.numel() * q.element_size() + (k.numel() + v.numel()) * k.element_size()


def tree_attention_op(q, k, v, lens, packed, dense):
    return ops.tree_attention(q, k, v, lens, packed)


def sdpa_dense_mask(q, k, v, lens, packed, dense):
    """HF's sdpa path for a tree: [B, H, T, D] queries, repeat_kv, boolean 4-D mask."""
    group = q.shape[2] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=dense)
    return out.transpose(1, 2)


IMPLEMENTATIONS = {"tree_attention": tree_attention_op, "sdpa_dense_mask": sdpa_dense_mask}


def run_cuda(benchmark, fn, args, graphed):
    if graphed:
        fn(*args)  # warm up outside capture (allocations, kernel attributes)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*args)

        def step():
            graph.replay()
            torch.cuda.synchronize()
    else:
        def step():
            fn(*args)
            torch.cuda.synchronize()
    benchmark.pedantic(step, rounds=50, iterations=5, warmup_rounds=3)


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("nodes", TREE_SIZES)
@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("device", DEVICES)
def test_tree_attention(benchmark, device, mode, prefix, nodes, impl):
    if device == "cpu" and mode == "graph":
        pytest.skip("CUDA graphs are CUDA only")
    args = make_inputs(device, prefix, nodes)
    fn = IMPLEMENTATIONS[impl]
    benchmark.group = f"tree_attention {device} {mode} prefix={prefix} T={nodes}"
    benchmark.extra_info.update(device=device, prefix=prefix, nodes=nodes, impl=impl, mode=mode)
    if device == "cuda":
        run_cuda(benchmark, fn, args, graphed=mode == "graph")
    else:
        rounds = 2 if prefix == 8192 else 3
        benchmark.pedantic(fn, args=args, rounds=rounds, iterations=1, warmup_rounds=1)
    record_bandwidth(benchmark, attention_bytes(*args[:3]))


@pytest.mark.skipif("cuda" not in DEVICES, reason="the batched target shape is a GPU benchmark")
@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_tree_attention_batch(benchmark, mode, impl):
    """The bandwidth target: B = 32, prefix 2048, T = 64 (estimate: 33-46% of 3.35 TB/s)."""
    args = make_inputs("cuda", 2048, 64, batch=32)
    benchmark.group = f"tree_attention cuda {mode} B=32 prefix=2048 T=64"
    benchmark.extra_info.update(device="cuda", batch=32, prefix=2048, nodes=64, impl=impl, mode=mode)
    run_cuda(benchmark, IMPLEMENTATIONS[impl], args, graphed=mode == "graph")
    record_bandwidth(benchmark, attention_bytes(*args[:3]))


@pytest.mark.parametrize("impl", ["op", "reference"])
@pytest.mark.parametrize("nodes", TREE_SIZES)
@pytest.mark.parametrize("device", DEVICES)
def test_build_tree_masks(benchmark, device, nodes, impl):
    gen = torch.Generator().manual_seed(0)
    _, parents = stack_trees([random_tree(nodes, gen) for _ in range(4)])
    parents, lens = parents.to(device), torch.tensor([100, 200, 300, 400], device=device)
    fn = ops.build_tree_masks if impl == "op" else reference.build_tree_masks
    benchmark.group = f"build_tree_masks {device} B=4 T={nodes}"

    def step():
        fn(parents, lens)
        if device == "cuda":
            torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20 if impl == "op" else 3, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("impl", ["op", "reference"])
@pytest.mark.parametrize("shape", [(4, 3, 16), (15, 5, 61)])  # (W, N, tree nodes)
@pytest.mark.parametrize("device", DEVICES)
def test_build_lookahead_masks(benchmark, device, shape, impl):
    window, ngram, nodes = shape
    sizes = torch.full((4,), window, device=device)
    levels = torch.full((4,), ngram - 1, device=device)
    rows = window * (ngram - 1) - 1
    fn = ops.build_lookahead_masks if impl == "op" else reference.build_lookahead_masks
    benchmark.group = f"build_lookahead_masks {device} B=4 W={window} N={ngram} T={nodes}"

    def step():
        fn(sizes, levels, nodes, rows)
        if device == "cuda":
            torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=20 if impl == "op" else 3, iterations=1, warmup_rounds=1)
