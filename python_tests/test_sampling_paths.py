"""Sampling and verification at the shapes and parameters that take each path of the CUDA kernels
(csrc/cuda/kernels/team_row.cuh), against the reference: top-k kept sets that fit the list or
not, top-p on the list, on a preselection or on exact fixed-point radix masses, min-p alone,
bf16 rows through the weight table (values in and out of its window), unaligned rows, long rows
split over a cluster of blocks, residual draws; run-to-run determinism on CUDA; deferred error
checks. On CPU the same cases check the CPU kernels."""

import pytest
import torch

from python_tests.conftest import DEVICES, FLOAT_DTYPES
from python_tests.sampling_cases import random_chain, random_params
from specdec_kernels import ops, reference
from specdec_kernels.sampling import SamplingParams

cuda_only = pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")

# Parameter sets by path: (temperature, top_k, top_p, min_p).
PATHS = {
    "no filter": (0.9, 0, 1.0, 0.0),
    "top-k list": (0.8, 50, 1.0, 0.0),
    "top-k list, top-p, min-p": (0.8, 50, 0.9, 0.01),
    "top-k past the list": (1.1, 900, 1.0, 0.0),
    "top-k past the list, top-p radix": (1.1, 900, 0.95, 0.0),
    "top-p preselected": (0.3, 0, 0.8, 0.0),
    "top-p wide (radix masses)": (4.0, 0, 0.97, 0.0),
    "min-p alone": (1.0, 0, 1.0, 0.002),
}


def path_params(names, device):
    values = [PATHS[name] for name in names]
    return SamplingParams.create(
        len(values),
        temperature=[v[0] for v in values],
        top_k=[v[1] for v in values],
        top_p=[v[2] for v in values],
        min_p=[v[3] for v in values],
        seed=torch.arange(len(values)) * 7919 + 11,
        device=device,
    )


def check_sample(logits, params, offset):
    tokens, probs = ops.sample_with_probs(logits, params, offset)
    want_tokens, want_probs = reference.sample_with_probs(logits, params, offset)
    assert torch.equal(tokens, want_tokens)
    if logits.device.type == "cpu":
        assert torch.equal(probs, want_probs)
    else:
        torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-7)
    return tokens, probs


PATH_VOCABS = [5000, 4099]  # 16-byte aligned rows, and not


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("vocab", PATH_VOCABS)
def test_every_path_matches_reference(device, gen, dtype, vocab):
    names = list(PATHS) * 3
    logits = (3.0 * torch.randn(len(names), vocab, generator=gen)).to(dtype).to(device)
    offset = torch.randint(0, 2**40, (len(names),), generator=gen).to(device)
    check_sample(logits, path_params(names, device), offset)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_cpu_code_path_matches_reference(cpu_isa, gen, dtype):
    """The CPU kernels' row passes on each instruction set (vector bodies and short tails):
    sampling on every filter path, and chains verified greedily and by sampling (with
    rejections, so residual sums and draws run)."""
    names = list(PATHS) * 2
    logits = (3.0 * torch.randn(len(names), 4099, generator=gen)).to(dtype)
    logits[1, 7] = float("nan")  # a bad row is reported, not sampled
    offset = torch.randint(0, 2**40, (len(names),), generator=gen)
    with pytest.raises(ValueError, match="NaN"):
        ops.sample(logits, path_params(names, "cpu"), offset)
    logits[1, 7] = 0.0
    check_sample(logits, path_params(names, "cpu"), offset)
    drafts, num_draft, chain, probs = random_chain(6, 4, 5003, dtype, gen, accept_bias=0.5)
    for params in [random_params(6, gen, greedy_fraction=0.5), SamplingParams.create(6)]:
        for q in [probs, None]:
            got = ops.verify_chain(drafts, num_draft, chain, q, params)
            want = reference.verify_chain(drafts, num_draft, chain, q, params)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def window_logits(shape, gen):
    """bf16 logits of rows long enough for the weight table (core/sampling.h), inside its window
    [2^-8, 2^8) in magnitude and outside it (large, tiny, zero, -inf), some rows with their
    maximum above the window; the last dimension is the vocabulary."""
    logits = 3.0 * torch.randn(shape, generator=gen)
    for start, step, values in [(0, 97, lambda n: 300.0 * torch.rand(n, generator=gen) - 400.0),
                                (1, 89, lambda n: 1e-3 * torch.randn(n, generator=gen))]:
        view = logits[..., start::step]
        view.copy_(values(view.numel()).reshape(view.shape))
    logits[..., 2::83] = 0.0
    logits[..., 3::79] = -float("inf")
    logits.view(-1, shape[-1])[::2, 5] = 280.0  # a maximum above the window
    return logits.to(torch.bfloat16)


def test_bf16_weight_table_window(device, gen):
    """bf16 rows through the weight table, logits in and out of its window: table and direct
    weights agree."""
    rows = 16
    names = (list(PATHS) * 2)[:rows]
    logits = window_logits((rows, 20000), gen).to(device)
    check_sample(logits, path_params(names, device), torch.arange(rows, device=device))


def test_bf16_weight_table_on_every_cpu_code_path(cpu_isa, gen):
    """The CPU passes that read the bf16 weight table on each instruction set, against the
    reference's weights bit for bit: exp sums and written probabilities (every filter path),
    residual sums and draws (sampled chains with rejections, with and without draft
    probabilities), typical acceptance's entropy sum; logits in and out of the window."""
    rows, vocab = 16, 20011  # odd: vector tails
    names = (list(PATHS) * 2)[:rows]
    offset = torch.randint(0, 2**40, (rows,), generator=gen)
    check_sample(window_logits((rows, vocab), gen), path_params(names, "cpu"), offset)
    drafts, num_draft, _, probs = random_chain(6, 3, vocab, torch.bfloat16, gen)
    chain = window_logits((6, 4, vocab), gen)
    chain[torch.arange(6)[:, None], torch.arange(3), drafts] = 9.0  # drafts often accepted
    params = random_params(6, gen, greedy_fraction=0.0)
    for q in [probs, None]:
        got = ops.verify_chain(drafts, num_draft, chain, q, params)
        want = reference.verify_chain(drafts, num_draft, chain, q, params)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    got = ops.typical_verify_chain(drafts, num_draft, chain, params)
    want = reference.typical_verify_chain(drafts, num_draft, chain, params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_top_p_radix_with_ties_and_a_huge_nucleus(device, gen):
    """Many equal logits: ties at the top-p threshold are kept, the nucleus passes the list."""
    rows, vocab = 6, 3000
    logits = torch.randint(-3, 3, (rows, vocab), generator=gen).float().to(device)
    params = SamplingParams.create(
        rows, temperature=2.0, top_p=[0.3, 0.6, 0.9, 0.99, 0.5, 0.75], top_k=[0, 0, 0, 0, 2000, 10],
        device=device,
    )
    check_sample(logits, params, torch.arange(rows, device=device))


def test_flat_rows_draw_floor_u_times_v_across_blocks(device):
    """Flat rows long enough to be split over several blocks (CUDA: a cluster): the draw is
    floor(u * V) exactly, so every segment boundary of the inverse CDF is exercised."""
    rows, vocab = 48, 2**17
    seeds = torch.arange(rows) * 104729 + 3
    expected = [
        int(reference.uniforms(int(s), 0, 0, reference.STREAM_SAMPLE)[1] * vocab) for s in seeds
    ]
    for dtype in FLOAT_DTYPES:
        params = SamplingParams.create(rows, temperature=1.0, seed=seeds, device=device)
        tokens = ops.sample(torch.zeros(rows, vocab, dtype=dtype, device=device), params)
        assert tokens.tolist() == expected, dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_long_rows_few_requests(device, gen, dtype):
    """B = 1-2 with a Llama-3-sized vocabulary: the CUDA launcher spreads each row over a
    cluster of blocks. Greedy, sampling with and without filters, draft probabilities that
    cause rejections (residual sums and draws over the whole split row)."""
    vocab = 128256
    drafts, num_draft, logits, probs = random_chain(2, 3, vocab, dtype, gen, device, accept_bias=0.3)
    for name in ["no filter", "top-k list, top-p, min-p", "top-p preselected", "top-p wide (radix masses)"]:
        params = path_params([name, name], device)
        offset = torch.tensor([5, 17], device=device)
        for q in [probs, None]:
            got = ops.verify_chain(drafts, num_draft, logits, q, params, offset)
            want = reference.verify_chain(drafts, num_draft, logits, q, params, offset)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name
    greedy = SamplingParams.create(2, device=device)
    got = ops.verify_chain(drafts, num_draft, logits, None, greedy)
    want = reference.verify_chain(drafts, num_draft, logits, None, greedy)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    rows = logits[:, 0].contiguous()
    check_sample(rows, path_params(["top-p wide (radix masses)", "top-k past the list"], device), None)


@cuda_only
def test_cuda_runs_are_deterministic():
    """Repeated runs give identical bits: every sum on the device is combined in a fixed order
    (radix masses as integers), whatever the block schedule."""
    gen = torch.Generator().manual_seed(3)
    names = list(PATHS) * 4
    for vocab in [4099, 50000, 128256]:
        logits = (3.0 * torch.randn(len(names), vocab, generator=gen)).to(torch.bfloat16).cuda()
        params = path_params(names, "cuda")
        first = ops.sample_with_probs(logits, params)
        for _ in range(5):
            again = ops.sample_with_probs(logits, params)
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1]), vocab
    drafts, num_draft, logits, probs = random_chain(16, 6, 50000, torch.bfloat16, gen, "cuda", accept_bias=0.3)
    params = random_params(16, gen, "cuda", greedy_fraction=0.0)
    first = ops.verify_chain(drafts, num_draft, logits, probs, params)
    for _ in range(5):
        again = ops.verify_chain(drafts, num_draft, logits, probs, params)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


# ----------------------------------------------------------------------------- deferred errors


def test_deferred_errors_setting_nests_and_cpu_still_raises_at_the_call(device):
    assert torch.ops.specdec.set_deferred_errors(False) is False
    with ops.deferred_errors():
        assert torch.ops.specdec.set_deferred_errors(True) is True
        with ops.deferred_errors():
            pass
        assert torch.ops.specdec.set_deferred_errors(True) is True  # restored to on
        ops.raise_deferred_errors()  # nothing queued: no error
        if device == "cpu":
            bad = torch.randn(2, 8)
            bad[1, 3] = float("nan")
            with pytest.raises(ValueError, match=r"request 1: logits\[1\] contains NaN"):
                ops.sample(bad, SamplingParams.create(2, temperature=1.0))
    assert torch.ops.specdec.set_deferred_errors(False) is False  # restored to off
    ops.raise_deferred_errors()


@cuda_only
def test_deferred_errors_on_cuda():
    """Under deferred_errors() a bad request does not raise at the call: its outputs are the
    error sentinels and raise_deferred_errors() raises the usual message once."""
    gen = torch.Generator().manual_seed(5)
    drafts, num_draft, logits, probs = random_chain(4, 3, 1000, torch.float32, gen, "cuda")
    params = random_params(4, gen, "cuda")
    logits[2, 0, 7] = float("nan")
    with ops.deferred_errors():
        tokens, num_accepted = ops.verify_chain(drafts, num_draft, logits, probs, params)
        good = ops.sample(logits[:, 1].contiguous(), params)  # rows 1 are fine
    assert int(num_accepted[2]) == 0 and (tokens[2] == -1).all()
    assert (good >= 0).all()
    with pytest.raises(ValueError, match=r"request 2: target_logits\[2, 0\] contains NaN"):
        ops.raise_deferred_errors()
    ops.raise_deferred_errors()  # checked once
    with ops.deferred_errors():  # more than 64 unchecked calls: the oldest is checked
        with pytest.raises(ValueError, match="request 2"):
            for _ in range(70):
                ops.verify_chain(drafts, num_draft, logits, probs, params)
    with pytest.raises(ValueError, match="request 2"):  # the 64 still queued
        ops.raise_deferred_errors()
    ops.raise_deferred_errors()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_row_scans_on_every_code_path(cpu_isa, dtype):
    """The validity and argmax scans of each instruction set (greedy rows: the scan; sampled
    rows: the scan that also copies) on rows of several 256-value blocks and a short tail: the
    first index of the maximum wins across blocks, lanes and signed zeros; rows of -inf with
    one finite value; NaN or +Inf in a vector body or in the tail is an error naming the
    request, as is a row with no finite value."""
    vocab = 1003
    logits = -1.0 - torch.arange(vocab * 5, dtype=torch.float32).reshape(5, vocab) / vocab
    logits[0, [900, 300]] = 7.0  # two blocks hold the maximum: the first one wins
    logits[1, [600, 258, 257]] = 2.0  # one block, neighbouring lanes
    logits[2] = -float("inf")
    logits[2, vocab - 2] = -5.0  # the only finite value, in the tail
    logits[3, 5], logits[3, 10] = 0.0, -0.0
    logits[4, vocab - 1] = 3.0
    logits = logits.to(dtype)
    want = [300, 257, vocab - 2, 5, vocab - 1]
    for temperature in [0.0, 1.0]:
        params = SamplingParams.create(5, temperature=temperature, seed=3)
        if temperature == 0.0:
            assert ops.sample(logits, params).tolist() == want
        else:
            check_sample(logits, params, torch.arange(5))
        for where in [17, vocab - 2]:
            for bad in [float("nan"), float("inf")]:
                broken = logits.clone()
                broken[1, where] = bad
                with pytest.raises(ValueError, match=r"request 1: .*NaN or \+Inf"):
                    ops.sample(broken, params)
        broken = logits.clone()
        broken[4] = -float("inf")
        with pytest.raises(ValueError, match="request 4: .*no finite value"):
            ops.sample(broken, params)
