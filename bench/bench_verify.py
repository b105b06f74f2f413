"""Sampling and verification: the fused ops vs the reference (softmax + filtering +
verification in eager torch, specdec_kernels.reference), for B in {1, 8, 32} requests, K in
{4, 8} drafts and V in {32000, 151936}. On a GPU the achieved bandwidth of reading the logits
is recorded (extra_info "GB/s", bytes = every row of target logits, each read at least once).

Drafts are made the target's favourite (their logit raised by 30), so every draft is accepted
and every row is processed: the worst case for the work done. The reference is slow (Python
loops over requests and nodes), so it runs on CPU only and for a single round.

The ``*_roofline`` benchmarks are the issue-11 targets: bf16 logits, V = 128256, the op only.
On CUDA they are timed by replaying a CUDA graph of 20 calls (no Python or launch gaps between
calls; graph capture skips the error-code copy), and record GB/s, % of the device's HBM
bandwidth and the estimate below.

CUDA estimates (not yet measured; kernels/sampling_kernels.cuh as of issue 11), H100 SXM:
3.35 TB/s, 132 SMs at ~1.75 GHz, 4 warp-instructions per SM per clock (2.96e13 thread-
instructions/s), 228 KiB shared memory per SM. Instruction counts are per element from the PTX
of the hot loops (ptxas -v: no spills, 96-128 registers at 256 threads).

  Layout. V = 128256 bf16 = 250.5 KiB per row; a row team is a cluster of S = 4 blocks of 256
  threads (the launcher's rule: the smallest S whose 64.5 KiB slice fits shared memory with two
  blocks per SM). B = 32, K = 8: 288 rows = 1152 blocks, 264 resident, 73.9 MB of logits, HBM
  floor 22.0 us. Every element is read from HBM once (pass 1); later passes read the block's
  shared-memory copy.

  verify_chain greedy, B=32 K=8: pass 1 only (max/argmax/NaN check, ~7 instr/elem = 8.7 us of
  issue, hidden under HBM). Streaming at ~90% of peak (24.5 us) plus the last residency wave's
  tail (~2.5 us) and launch ramp: ~28 us, ~79% of 3.35 TB/s (target >= 70%).

  verify_chain sampling, no filters (T only), B=32 K=8: pass 1 (7/elem) + the weight sums from
  shared memory (bf16 table lookup + TwoSum, ~14 instr/elem = 17.4 us of issue; shared memory
  ~4 cycles per 32 elements with ~3.5-way random bank conflicts on the table = ~20 us: the
  bound) + table build (4096 exps per row, split over the team: ~1.2 us) + one-segment draws
  (~1% of a pass). SM time ~31 us against HBM 24.5 us, overlapped across the two blocks per SM:
  ~33 us, ~66% (60-70%; target >= 70%: the table's bank conflicts are what stands between).

  verify_chain sampling, top-k 50 + top-p 0.9 (the SAMPLING config), B=32 K=8: pass 1 (7) +
  two count-only radix rounds from shared memory (~13 and ~8 instr/elem: the key transform,
  the bucket match, conflict-free lane columns, no weights) + one gather pass (~7/elem); top-p,
  min-p, the kept mass and the draw then work on the 50-token list (no table, no weight pass).
  ~35 instr/elem = 43.7 us of issue: ~46 us, ~48% (target >= 50%). Next steps, in order of
  gain: keep the first round's chosen bucket as a compact candidate list (the CPU kernel does),
  so round 2 and the gather do not re-scan the row (~-7/elem); fold round 1 into pass 1;
  compute the keys of two bf16 elements per 32-bit operation.

  verify_tree (the tree_case shapes) and sample at N = 288 rows: as verify_chain sampling (the
  same passes per row).

  sample, N = 32 rows (8.2 MB, floor 2.5 us): S = 8 (256 blocks, one wave); latency-bound:
  ~8-10 us (~25-30%). B = 1, K = 4 verify_chain (5 rows, 1.3 MB, L2-resident when repeated):
  40 blocks, ~8-10 us, set by ~8 team barriers and the per-block passes, not bandwidth.

  typical_verify_chain, B=32 K=8: pass 1 + weight sums + the entropy sum (two table passes,
  ~39 instr/elem in all; shared memory ~8 cycles per 32 elements): ~45 us, ~49% (no target).

  Before (the previous kernels, for comparison, from their ptxas report: 102 registers at 512
  threads, one block per SM and row): 288 rows in 2.2 waves of 132 single-SM rows; per row
  ~45 instr/elem for the double-accumulated weight sums and 2+ radix passes with double
  shuffles per warp bin: sampling ~100-150 us, filtered ~200+ us, greedy ~30 us.

What a measurement should check first if it misses: (1) the team size and shared memory the
launcher picked (two blocks per SM?), (2) cluster barrier latency (assumed < 1 us; ~8 per row),
(3) shared-memory bank conflicts on the weight table (ncu: l1tex__data_bank_conflicts), (4)
whether pass 1 keeps ~32 KiB in flight per block.
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


#: The rows of each benchmark group: the op, the eager reference, and the roofline row
#: ``logits.amax(-1)`` (one pass over the same logits: what a greedy row must cost at least).
IMPLS = ["op", "reference", "amax"]


def call_of(impl, logits, op, ref):
    """The callable a row times: ``op()``, ``ref()`` or the amax roofline over ``logits``."""
    return {"op": op, "reference": ref, "amax": lambda: logits.amax(-1)}[impl]


def skip_reference_off_cpu(impl, device):
    if impl == "reference" and device != "cpu":
        pytest.skip("the reference runs on CPU only")


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("impl", IMPLS)
def test_sample(benchmark, device, impl, batch, vocab):
    skip_reference_off_cpu(impl, device)
    _, logits, _ = chain_case(batch, 0, vocab, device)
    logits = logits[:, 0].contiguous()
    params = SamplingParams.create(batch, seed=7, device=device, **SAMPLING)
    fn = call_of(
        impl, logits, lambda: ops.sample(logits, params), lambda: reference.sample(logits, params)
    )
    benchmark.group = f"sample B={batch} V={vocab} {device}"
    run_and_record(benchmark, device, impl, fn, logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("mode", ["greedy", "sampling"])
@pytest.mark.parametrize("impl", IMPLS)
def test_verify_chain(benchmark, device, impl, mode, batch, k, vocab):
    skip_reference_off_cpu(impl, device)
    drafts, logits, probs = chain_case(batch, k, vocab, device)
    kwargs = dict(temperature=0.0) if mode == "greedy" else SAMPLING
    params = SamplingParams.create(batch, seed=7, device=device, **kwargs)
    args = (drafts, None, logits, probs, params)
    fn = call_of(impl, logits, lambda: ops.verify_chain(*args), lambda: reference.verify_chain(*args))
    benchmark.group = f"verify_chain {mode} B={batch} K={k} V={vocab} {device}"
    run_and_record(benchmark, device, impl, fn, logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("impl", IMPLS)
def test_verify_tree(benchmark, device, impl, batch, k, vocab):
    skip_reference_off_cpu(impl, device)
    tokens, parents, logits, probs = tree_case(batch, k, vocab, device)
    params = SamplingParams.create(batch, seed=7, device=device, **SAMPLING)
    args = (tokens, parents, logits, probs, params)
    fn = call_of(impl, logits, lambda: ops.verify_tree(*args), lambda: reference.verify_tree(*args))
    benchmark.group = f"verify_tree sampling B={batch} T={k + 1} V={vocab} {device}"
    run_and_record(benchmark, device, impl, fn, logits)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", DRAFTS)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("impl", IMPLS)
def test_typical_verify_chain(benchmark, device, impl, batch, k, vocab):
    skip_reference_off_cpu(impl, device)
    drafts, logits, _ = chain_case(batch, k, vocab, device)
    params = SamplingParams.create(batch, seed=7, device=device, temperature=0.7)
    args = (drafts, None, logits, params)
    fn = call_of(
        impl, logits, lambda: ops.typical_verify_chain(*args),
        lambda: reference.typical_verify_chain(*args),
    )
    benchmark.group = f"typical_verify_chain B={batch} K={k} V={vocab} {device}"
    run_and_record(benchmark, device, impl, fn, logits)


# ----------------------------------------------------------------------------- roofline targets

ROOFLINE_VOCAB = 128256
ROOFLINE_MODES = {
    "amax": None,  # logits.amax(-1) over the same tensor: the one-pass row of each group
    "greedy": dict(temperature=0.0),
    "sampling": dict(temperature=0.8),
    "top-k+top-p": SAMPLING,
}
# The estimates of the module docstring (us per call on an H100 SXM), keyed by (op, mode, rows).
ESTIMATE_US = {
    ("verify_chain", "greedy", 288): 28.0,
    ("verify_chain", "sampling", 288): 33.0,
    ("verify_chain", "top-k+top-p", 288): 46.0,
    ("sample", "greedy", 288): 28.0,
    ("sample", "sampling", 288): 33.0,
    ("sample", "top-k+top-p", 288): 46.0,
}
PEAK_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s (H100 SXM; H100 PCIe is 2.0e12)


def graph_replayed(fn, calls=20):
    """fn captured `calls` times in one CUDA graph; the returned callable replays it and waits."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm up outside capture (lazy initialisation, allocator)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()

    def run():
        graph.replay()
        torch.cuda.synchronize()

    return run


def roofline_call(mode, logits, op):
    """``op(params)`` with the mode's sampling parameters, or amax over ``logits``."""
    if ROOFLINE_MODES[mode] is None:
        return lambda: logits.amax(-1)
    batch = logits.shape[0]
    params = SamplingParams.create(batch, seed=7, device=logits.device, **ROOFLINE_MODES[mode])
    return lambda: op(params)


def run_roofline(benchmark, device, fn, logits, key):
    nbytes = logits.numel() * logits.element_size()
    benchmark.extra_info["est. us (H100)"] = ESTIMATE_US.get(key, "-")
    if device != "cuda":
        benchmark.pedantic(fn, rounds=2, iterations=1, warmup_rounds=1)
        return
    calls = 20
    benchmark.pedantic(graph_replayed(fn, calls), rounds=10, iterations=1, warmup_rounds=2)
    per_call = benchmark.stats.stats.median / calls
    benchmark.extra_info["us/call"] = round(per_call * 1e6, 2)
    benchmark.extra_info["GB/s"] = round(nbytes / per_call / 1e9, 1)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BANDWIDTH.items() if k in name), None)
    if peak is not None:
        benchmark.extra_info["% of HBM"] = round(100 * nbytes / per_call / peak, 1)


@pytest.mark.parametrize("mode", list(ROOFLINE_MODES))
@pytest.mark.parametrize("batch, k", [(32, 8), (1, 4)])
def test_verify_chain_roofline(benchmark, device, mode, batch, k):
    drafts, logits, probs = chain_case(batch, k, ROOFLINE_VOCAB, device)
    benchmark.group = f"roofline verify_chain B={batch} K={k} V={ROOFLINE_VOCAB} bf16 {device}"
    fn = roofline_call(mode, logits, lambda p: ops.verify_chain(drafts, None, logits, probs, p))
    run_roofline(benchmark, device, fn, logits, ("verify_chain", mode, batch * (k + 1)))


@pytest.mark.parametrize("mode", list(ROOFLINE_MODES))
@pytest.mark.parametrize("rows", [288, 32])
def test_sample_roofline(benchmark, device, mode, rows):
    _, logits, _ = chain_case(rows, 0, ROOFLINE_VOCAB, device)
    logits = logits[:, 0].contiguous()
    benchmark.group = f"roofline sample N={rows} V={ROOFLINE_VOCAB} bf16 {device}"
    fn = roofline_call(mode, logits, lambda p: ops.sample(logits, p))
    run_roofline(benchmark, device, fn, logits, ("sample", mode, rows))
