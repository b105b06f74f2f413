"""Sampling and verification: the fused ops vs the reference (softmax + filtering +
verification in eager torch, specdec_kernels.reference), for B in {1, 8, 32} requests, K in
{4, 8} drafts and V in {32000, 151936}. On a GPU the achieved bandwidth of reading the logits
is recorded (extra_info "GB/s", bytes = every row of target logits, each read at least once).

Drafts are made the target's favourite (their logit raised by 30), so every draft is accepted
and every row is processed: the worst case for the work done. The reference is slow (Python
loops over requests and nodes), so it runs on CPU only and for a single round.
"""

import pytest
import torch

from bench.conftest import record_bandwidth, synchronized
from specdec_kernels import ops, reference
from specdec_kernels.sampling import SamplingParams

BATCHES = [1, 8, 32]
DRAFTS = [4, 8]
VOCABS = [32000, 151936]
SAMPLING = dict(temperature=0.8, top_k=50, top_p=0.9)


def chain_case(batch, k, vocab, device, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(batch, k + 1, vocab, generator=gen)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    logits.scatter_add_(2, drafts[:, :, None], torch.full((batch, k, 1), 30.0))
    probs = torch.full((batch, k, vocab), 0.05 / vocab)
    probs.scatter_(2, drafts[:, :, None], 0.95)
    return drafts.to(device), logits.to(dtype).to(device), probs.to(device)


def tree_case(batch, k, vocab, device, dtype=torch.bfloat16):
    """K + 1 nodes: the chain 0 -> 1 -> ... -> K-1 (all accepted) plus node K, a second child
    of the root that is never reached."""
    drafts, logits, probs = chain_case(batch, k, vocab, device, dtype)
    parents = torch.tensor([-1] + list(range(k - 1)) + [0])
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64, device=device), drafts], 1)
    tree_probs = torch.cat([torch.zeros_like(probs[:, :1]), probs], 1)
    return tokens, parents.expand(batch, k + 1).contiguous().to(device), logits, tree_probs


def run_and_record(benchmark, device, impl, fn, logits):
    benchmark.extra_info["impl"] = impl
    if impl == "reference":
        benchmark.pedantic(synchronized(fn, device), rounds=1, iterations=1)
    else:
        benchmark.pedantic(synchronized(fn, device), rounds=3, iterations=1, warmup_rounds=1)
    if device == "cuda":
        record_bandwidth(benchmark, logits.numel() * logits.element_size())


def skip_reference_off_cpu(impl, device):
    if impl == "reference" and device != "cpu":
        pytest.skip("the reference runs on CPU only")


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("impl", ["op", "reference"])
def test_sample(benchmark, device, impl, batch, vocab):
    skip_reference_off_cpu(impl, device)
    _, logits, _ = chain_case(batch, 0, vocab, device)
    logits = logits[:, 0].contiguous()
    params = SamplingParams.create(batch, seed=7, device=device, **SAMPLING)
    fn = ops.sample if impl == "op" else reference.sample
    benchmark.group = f"sample B={batch} V={vocab} {device}"
    run_and_record(benchmark, device, impl, lambda: fn(logits, params), logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("mode", ["greedy", "sampling"])
@pytest.mark.parametrize("impl", ["op", "reference"])
def test_verify_chain(benchmark, device, impl, mode, batch, k, vocab):
    skip_reference_off_cpu(impl, device)
    drafts, logits, probs = chain_case(batch, k, vocab, device)
    kwargs = dict(temperature=0.0) if mode == "greedy" else SAMPLING
    params = SamplingParams.create(batch, seed=7, device=device, **kwargs)
    fn = ops.verify_chain if impl == "op" else reference.verify_chain
    benchmark.group = f"verify_chain {mode} B={batch} K={k} V={vocab} {device}"
    run_and_record(benchmark, device, impl, lambda: fn(drafts, None, logits, probs, params), logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("impl", ["op", "reference"])
def test_verify_tree(benchmark, device, impl, batch, k, vocab):
    skip_reference_off_cpu(impl, device)
    tokens, parents, logits, probs = tree_case(batch, k, vocab, device)
    params = SamplingParams.create(batch, seed=7, device=device, **SAMPLING)
    fn = ops.verify_tree if impl == "op" else reference.verify_tree
    benchmark.group = f"verify_tree sampling B={batch} T={k + 1} V={vocab} {device}"
    run_and_record(benchmark, device, impl, lambda: fn(tokens, parents, logits, probs, params), logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("impl", ["op", "reference"])
def test_typical_verify_chain(benchmark, device, impl, batch, k, vocab):
    skip_reference_off_cpu(impl, device)
    drafts, logits, _ = chain_case(batch, k, vocab, device)
    params = SamplingParams.create(batch, seed=7, device=device, temperature=0.7)
    fn = ops.typical_verify_chain if impl == "op" else reference.typical_verify_chain
    benchmark.group = f"typical_verify_chain B={batch} K={k} V={vocab} {device}"
    run_and_record(benchmark, device, impl, lambda: fn(drafts, None, logits, params), logits)
