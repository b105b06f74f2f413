"""ops.sample / ops.sample_with_probs: reference agreement, processing semantics, Philox,
edge cases, statistics, opcheck, torch.compile and bad input."""

import pytest
import torch

from python_tests.conftest import FLOAT_DTYPES
from python_tests.sampling_cases import (
    SEED_SAMPLE_U_MAX,
    chi_square_pvalue,
    random_logits,
    random_params,
)
from specdec_kernels import ops, reference
from specdec_kernels.sampling import SamplingParams

# ----------------------------------------------------------------------------- Philox


@pytest.mark.parametrize(
    "counter, key, expected",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_reference_philox_known_answers(counter, key, expected):
    """Random123's known-answer vectors for Philox4x32-10."""
    assert reference.philox4x32_10(counter, key) == expected


def test_kernel_uniforms_match_reference_bits(device):
    """A flat distribution over V = 2^12 tokens makes the drawn token floor(u * V): the kernels'
    Philox stream (seed and offset words, position, stream tag, float conversion) must give the
    reference's uniforms, 12 bits at a time, over many seeds and offsets (negative ones too)."""
    n, vocab = 2000, 4096
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=torch.Generator().manual_seed(5))
    offsets = torch.randint(0, 2**40, (n,), generator=torch.Generator().manual_seed(6))
    params = SamplingParams.create(n, temperature=1.0, seed=seeds, device=device)
    tokens = ops.sample(torch.zeros(n, vocab, device=device), params, offsets.to(device)).cpu()
    expected = [
        int(reference.uniforms(int(s), int(o), 0, reference.STREAM_SAMPLE)[1] * vocab)
        for s, o in zip(seeds, offsets)
    ]
    assert tokens.tolist() == expected


def test_reference_exp_is_accurate():
    x = torch.linspace(-87.0, 0.0, 200001)
    rel = (reference.specdec_exp(x).double() - x.double().exp()).abs() / x.double().exp()
    assert float(rel.max()) < 1.2e-7
    assert torch.equal(reference.specdec_exp(torch.tensor([-87.5, -1e30, -float("inf")])), torch.zeros(3))
    assert float(reference.specdec_exp(torch.tensor(0.0))) == 1.0


# ----------------------------------------------------------------------------- reference


# Vocabulary sizes of the reference comparison (also run by the CUDA kernel's emulation).
VOCABS = [1, 7, 64, 1000, 4099]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_matches_reference(device, gen, dtype, vocab):
    rows = 48
    logits = random_logits((rows, vocab), dtype, gen, device=device)
    params = random_params(rows, gen, device)
    offset = torch.randint(0, 10**6, (rows,), generator=gen).to(device)
    tokens, probs = ops.sample_with_probs(logits, params, offset)
    want_tokens, want_probs = reference.sample_with_probs(logits, params, offset)
    assert tokens.dtype == torch.int64 and probs.dtype == torch.float32
    assert torch.equal(tokens, want_tokens)
    if device == "cpu":  # the same weights and the same sums: bit for bit
        assert torch.equal(probs, want_probs)
    else:  # sums in another order
        torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-7)
    assert torch.equal(ops.sample(logits, params, offset), tokens)


def test_processing_semantics_independent_of_reference(gen):
    """Temperature, top-k, top-p and min-p against plain torch formulas (sort-based)."""
    vocab = 300
    logits = 2 * torch.randn(4, vocab, generator=gen)
    params = SamplingParams.create(
        4, temperature=[0.7, 1.3, 1.0, 0.5], top_k=[0, 17, 0, 0], top_p=[1.0, 1.0, 0.6, 1.0],
        min_p=[0.0, 0.0, 0.0, 0.05],
    )
    _, probs = ops.sample_with_probs(logits, params)
    plain = torch.softmax(logits / params.temperature[:, None], -1)
    torch.testing.assert_close(probs[0], plain[0], rtol=1e-5, atol=1e-7)
    kth = logits[1].sort(descending=True).values[16]
    top_k = torch.where(logits[1] >= kth, plain[1], 0.0)
    torch.testing.assert_close(probs[1], top_k / top_k.sum(), rtol=1e-5, atol=1e-7)
    assert int((probs[1] > 0).sum()) == 17
    sorted_p, order = plain[2].sort(descending=True)
    need = int((sorted_p.cumsum(0) < 0.6).sum()) + 1  # smallest prefix reaching 0.6
    top_p = torch.zeros(vocab)
    top_p[order[:need]] = plain[2][order[:need]]
    torch.testing.assert_close(probs[2], top_p / top_p.sum(), rtol=1e-5, atol=1e-7)
    min_p = torch.where(plain[3] >= 0.05 * plain[3].max(), plain[3], 0.0)
    torch.testing.assert_close(probs[3], min_p / min_p.sum(), rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- semantics


def test_greedy_ties_go_to_the_lowest_id(device):
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0],
            [5.0, 5.0, 5.0, 5.0],
            [-float("inf"), -float("inf"), 0.5, 0.5],
            [0.0, -0.0, -1.0, -2.0],
        ],
        device=device,
    )
    params = SamplingParams.create(4, device=device)
    for dtype in FLOAT_DTYPES:
        tokens, probs = ops.sample_with_probs(logits.to(dtype), params)
        assert tokens.tolist() == [1, 0, 2, 0]
        assert torch.equal(probs.cpu(), torch.nn.functional.one_hot(tokens.cpu(), 4).float())


def test_top_k_keeps_ties_and_off_values(device, gen):
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, -1.0]], device=device)
    keep = lambda k: (ops.sample_with_probs(logits, SamplingParams.create(1, temperature=1.0, top_k=k, device=device))[1][0] > 0).cpu()  # noqa: E731
    assert keep(1).tolist() == [False, True, False, True, False, False]  # tied maximum: both kept
    assert keep(3).tolist() == [False, True, True, True, True, False]  # ties with the 3rd kept
    everything = [True] * 6
    assert keep(0).tolist() == keep(-3).tolist() == keep(6).tolist() == keep(100).tolist() == everything
    random = random_logits((8, 50), torch.float32, gen, device=device)
    base = SamplingParams.create(8, temperature=0.9, seed=3, device=device)
    off = SamplingParams.create(8, temperature=0.9, seed=3, top_k=50, top_p=1.0, device=device)
    assert all(torch.equal(a, b) for a, b in zip(ops.sample_with_probs(random, base), ops.sample_with_probs(random, off)))


def test_top_p_keeps_the_smallest_prefix(device):
    # probabilities 0.5, 0.25, 0.125, 0.125 (exact in float32)
    logits = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25]])).to(device)
    keep = lambda p: (ops.sample_with_probs(logits, SamplingParams.create(1, temperature=1.0, top_p=p, device=device))[1][0] > 0).cpu().tolist()  # noqa: E731
    assert keep(0.4) == [False, True, False, False]
    assert keep(0.5) == [False, True, False, False]  # mass reaches top_p exactly: stop there
    assert keep(0.6) == [False, True, False, True]
    assert keep(0.8) == [True, True, True, True]  # the tied 0.125s are kept together
    assert keep(1.0) == [True, True, True, True]


def test_vocab_of_one(device):
    params = SamplingParams.create(3, temperature=[0.0, 1.0, 2.0], top_k=[0, 1, 5], top_p=[1.0, 0.5, 0.1], device=device)
    tokens, probs = ops.sample_with_probs(torch.randn(3, 1, device=device), params)
    assert tokens.tolist() == [0, 0, 0] and probs.tolist() == [[1.0]] * 3


def test_negative_infinity_is_probability_zero(device):
    logits = torch.full((200, 5), -float("inf"), device=device)
    logits[:, 3] = 0.0
    logits[:, 1] = 0.5
    params = SamplingParams.create(200, temperature=1.0, seed=torch.arange(200), device=device)
    tokens, probs = ops.sample_with_probs(logits, params)
    assert set(tokens.tolist()) == {1, 3}
    assert torch.equal(probs[:, [0, 2, 4]].cpu(), torch.zeros(200, 3))


def test_uniform_near_one_draws_the_last_kept_token(device):
    """u = 1 - 2^-24 must pick the last token of positive probability, never a filtered one."""
    assert reference.uniforms(SEED_SAMPLE_U_MAX, 0, 0, reference.STREAM_SAMPLE)[1] == 1 - 2.0**-24
    logits = torch.tensor([[3.0, 0.0, 2.0, 1.0, -5.0]], device=device)
    for top_k, last in [(0, 4), (3, 3), (1, 0)]:
        params = SamplingParams.create(1, temperature=1.0, top_k=top_k, seed=SEED_SAMPLE_U_MAX, device=device)
        assert ops.sample(logits, params).item() == last


def test_request_output_does_not_depend_on_the_batch(device, gen):
    rows = 24
    logits = random_logits((rows, 500), torch.bfloat16, gen, device=device)
    params = random_params(rows, gen, device)
    offset = torch.arange(rows, device=device) * 7
    tokens = ops.sample(logits, params, offset)
    perm = torch.randperm(rows, generator=gen).to(device)
    permuted = ops.sample(logits[perm], params.select(perm), offset[perm])
    assert torch.equal(permuted, tokens[perm])
    for n in [0, 5, rows - 1]:
        alone = ops.sample(logits[n : n + 1], params.select(torch.tensor([n], device=device)), offset[n : n + 1])
        assert alone.item() == tokens[n].item()


def test_offsets_and_seeds_change_the_draws(device):
    logits = torch.zeros(1000, 1000, device=device)
    a = ops.sample(logits, SamplingParams.create(1000, temperature=1.0, seed=1, device=device))
    b = ops.sample(logits, SamplingParams.create(1000, temperature=1.0, seed=2, device=device))
    c = ops.sample(logits, SamplingParams.create(1000, temperature=1.0, seed=1, device=device), torch.ones(1000, dtype=torch.int64, device=device))
    assert len(set(a.tolist())) == 1  # same seed, same offset, same row: same draw
    assert float((a != b).float().mean()) > 0.99 and float((a != c).float().mean()) > 0.99


def test_draws_follow_the_processed_distribution(device):
    """Chi-square over 10^6 draws (one per request, seeds 0..10^6-1) against the processed
    distribution, for temperature with top-k, and for top-p with min-p."""
    n, vocab = 10**6, 24
    logits = torch.linspace(-2.0, 3.0, vocab)[torch.randperm(vocab, generator=torch.Generator().manual_seed(0))]
    for kwargs in [dict(temperature=0.8, top_k=9), dict(temperature=1.7, top_p=0.85, min_p=0.02)]:
        params = SamplingParams.create(n, seed=torch.arange(n), device=device, **kwargs)
        rows = logits.to(device).expand(n, vocab).contiguous()
        tokens = ops.sample(rows, params)
        probs = ops.sample_with_probs(rows[:1], params.select(torch.tensor([0], device=device)))[1][0]
        counts = torch.bincount(tokens.cpu(), minlength=vocab)
        assert chi_square_pvalue(counts, probs) > 1e-3, kwargs


# ----------------------------------------------------------------------------- opcheck, compile


def test_opcheck(device, gen):
    logits = random_logits((5, 37), torch.float16, gen, device=device)
    params = random_params(5, gen, device)
    args = (logits, *params.tensors(), torch.arange(5, device=device))
    torch.library.opcheck(torch.ops.specdec.sample.default, args)
    torch.library.opcheck(torch.ops.specdec.sample_with_probs.default, args)


def test_torch_compile_fullgraph(device, gen):
    logits = random_logits((6, 100), torch.float32, gen, device=device)
    params = random_params(6, gen, device)
    offset = torch.arange(6, device=device)

    @torch.compile(fullgraph=True)
    def step(logits, temperature, top_k, top_p, min_p, seed, offset):
        p = SamplingParams(temperature, top_k, top_p, min_p, seed)
        tokens, probs = ops.sample_with_probs(logits * 2.0, p, offset)
        return tokens + 1, probs.sum(-1)

    tokens, sums = step(logits, *params.tensors(), offset)
    want = reference.sample(logits * 2.0, params, offset)
    assert torch.equal(tokens, want + 1)
    torch.testing.assert_close(sums, torch.ones(6, device=device))


# ----------------------------------------------------------------------------- bad input


def test_rejects_bad_logits_naming_the_request(device):
    params = SamplingParams.create(3, temperature=[0.0, 1.0, 1.0], device=device)
    for bad, row in [(float("nan"), 1), (float("inf"), 2), (float("nan"), 0)]:
        logits = torch.randn(3, 10, device=device)
        logits[row, 4] = bad
        with pytest.raises(ValueError, match=rf"request {row}: logits\[{row}\] contains NaN or \+Inf"):
            ops.sample(logits, params)
    logits = torch.randn(3, 10, device=device)
    logits[2] = -float("inf")
    with pytest.raises(ValueError, match="request 2: .*no finite value"):
        ops.sample(logits, params)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.5, "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("temperature", float("inf"), "temperature"),
        ("temperature", 1e-45, "temperature"),
        ("top_p", 0.0, r"top_p\[1\] = 0 must be in \(0, 1\]"),
        ("top_p", 1.5, "top_p"),
        ("min_p", 1.0, r"min_p\[1\] = 1 must be in \[0, 1\)"),
        ("min_p", -0.1, "min_p"),
    ],
)
def test_rejects_bad_parameters(device, field, value, message):
    params = SamplingParams.create(2, temperature=1.0, device=device)
    getattr(params, field)[1] = value
    with pytest.raises(ValueError, match=f"request 1: {message}"):
        ops.sample(torch.randn(2, 5, device=device), params)


def test_rejects_bad_shapes_and_dtypes(device):
    params = SamplingParams.create(2, device=device)
    logits = torch.randn(2, 5, device=device)
    with pytest.raises(ValueError, match=r"logits must have shape \[N, V\]"):
        ops.sample(logits[0], params)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        ops.sample(logits.double(), params)
    with pytest.raises(ValueError, match="vocabulary of 1 to"):
        ops.sample(logits[:, :0], params)
    with pytest.raises(ValueError, match="contiguous"):
        ops.sample(torch.randn(5, 2, device=device).t(), params)
    with pytest.raises(ValueError, match="temperature must have shape"):
        ops.sample(torch.randn(3, 5, device=device), params)
    with pytest.raises(ValueError, match="offset must have dtype"):
        ops.sample(logits, params, torch.zeros(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="must be a scalar or have 2 values"):
        SamplingParams.create(2, temperature=[1.0, 2.0, 3.0])
