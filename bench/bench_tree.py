"""Microbenchmarks of the tree ops (pytest-benchmark).

    python3 -m pytest bench/bench_tree.py                  # CPU (and CUDA when available)
    python3 -m pytest bench/bench_tree.py -k cuda --benchmark-columns=median,min

tree_attention is compared with what Hugging Face does for a tree forward: SDPA over
``[prefix + tree]`` with a dense 4-D mask (K/V repeated per query head for GQA, since HF does not
use SDPA's GQA mode when a mask is given). Masks are built once outside the timed region, as a
model builds them once per forward for all layers. Shape: one request, 32 query heads, 8 KV
heads, head dim 128 (a Llama-style 7-8B layer); fp16 on CUDA, fp32 on CPU. On CUDA each case is
timed eagerly (the op validates cache_lens with one device-to-host copy per call) and replayed
from a CUDA graph (no host work: kernel time only). GPU target: tree_attention >= 3x the SDPA
baseline at prefix 2048, T = 64.
"""

import pytest
import torch

import specdec_kernels
from specdec_kernels import ops, reference
from specdec_kernels.tree import stack_trees, tree_attention_mask_4d, tree_from_parents

DEVICES = ["cpu"]
if torch.cuda.is_available() and specdec_kernels.has_cuda_kernels():
    DEVICES.append("cuda")

PREFIXES = [512, 2048, 8192]
TREE_SIZES = [8, 64]
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def random_tree(num_nodes, gen):
    parents = [-1] + [int(torch.randint(max(0, j - 4), j, (1,), generator=gen)) for j in range(1, num_nodes)]
    return tree_from_parents(parents)


def make_inputs(device, prefix, nodes):
    gen = torch.Generator().manual_seed(0)
    dtype = torch.float16 if device == "cuda" else torch.float32
    _, parents = stack_trees([random_tree(nodes, gen)])
    lens = torch.tensor([prefix])
    masks = reference.build_tree_masks(parents, lens)
    q = torch.randn(1, nodes, Q_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    k = torch.randn(1, KV_HEADS, prefix + nodes, HEAD_DIM, generator=gen).to(device, dtype)
    v = torch.randn(1, KV_HEADS, prefix + nodes, HEAD_DIM, generator=gen).to(device, dtype)
    dense = tree_attention_mask_4d(masks.mask, torch.ones(1, prefix, dtype=torch.bool)).to(device)
    return q, k, v, lens.to(device), masks.packed_mask.to(device), dense


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
