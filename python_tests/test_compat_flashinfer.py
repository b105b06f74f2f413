"""FlashInfer's own sampling test cases, ported to :mod:`specdec_kernels.compat.flashinfer`.

Source: flashinfer-ai/flashinfer ``tests/utils/test_sampling.py`` (the speculative case
``test_chain_speculative_sampling`` and the sampling, renorm, validation, seed and NaN cases
around it). The assertions are FlashInfer's; sizes are cut for a 2-core CPU (FlashInfer runs
up to 989 x 128256 with millions of trials on a GPU): batches 1, 7 and 99, vocabularies 111
and 32000 (odd and even), 200k trials for the frequency tests.
"""

import pytest
import torch

import specdec_kernels.compat.flashinfer as flashinfer
from python_tests.compat_helpers import device  # noqa: F401  (fixture)

BATCHES = [1, 7, 99]
VOCABS = [111, 32000]
TRIALS = 200_000


def normal(std):
    def draw(shape, dev, gen):
        return torch.randn(shape, generator=gen).to(dev) * std

    draw.__name__ = f"normal({std})"
    return draw


def gumbel(beta):
    def draw(shape, dev, gen):
        u = torch.rand(shape, generator=gen)
        return (torch.log(-torch.log(u + 1e-20) + 1e-20) / beta).to(dev)

    draw.__name__ = f"gumbel({beta})"
    return draw


DISTRIBUTIONS = [normal(1), normal(5), gumbel(0.1)]


def random_probs(batch, vocab, dev, seed=42):
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(batch, vocab, generator=gen)
    return (p / p.sum(-1, keepdim=True)).to(dev)


def top_p_mask(probs, p, eps=1e-4):
    """FlashInfer's reference: the tokens whose ascending cumulative mass exceeds 1 - p."""
    sorted_p, order = torch.sort(probs, descending=False)
    cdf = torch.cumsum(sorted_p, -1)
    mask = torch.zeros_like(probs, dtype=torch.int32)
    mask.scatter_add_(1, order, (cdf > (1 - p) - eps).int())
    return mask


def top_k_mask(probs, k):
    pivot = torch.sort(probs, descending=True).values.gather(1, (k - 1).view(-1, 1))
    return (probs >= pivot).int()


def freq(samples, vocab):
    counts = torch.zeros(vocab, dtype=torch.float64, device=samples.device)
    counts.scatter_add_(0, samples.long(), torch.ones_like(samples, dtype=torch.float64))
    return (counts / samples.numel()).float()


# ------------------------------------------------------------------ frequencies (test_*_freq)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.__name__)
@pytest.mark.parametrize("zero_ratio", [0.0, 0.5, 0.9])
def test_sampling_freq(device, distribution, zero_ratio):
    vocab = 111
    gen = torch.Generator().manual_seed(42)
    logits = distribution((1, vocab), device, gen)
    zeros = torch.randperm(vocab, generator=gen)[: int(vocab * zero_ratio)]
    logits[:, zeros.to(device)] = float("-inf")
    probs = torch.softmax(logits, -1)
    samples = flashinfer.sampling_from_probs(
        probs, indices=torch.zeros(TRIALS, dtype=torch.int32, device=device), seed=1, offset=0
    )
    f = freq(samples, vocab)
    assert f[zeros.to(device)].sum() == 0
    assert torch.cosine_similarity(f, probs[0], 0) > 0.99


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.__name__)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling_freq(device, distribution, p):
    vocab = 111
    logits = distribution((1, vocab), device, torch.Generator().manual_seed(42))
    probs = torch.softmax(logits, -1)
    mask = top_p_mask(probs, p, eps=0)
    renormed = flashinfer.top_p_renorm_probs(probs, p)
    samples = flashinfer.top_p_sampling_from_probs(
        probs, p, indices=torch.zeros(TRIALS, dtype=torch.int32, device=device), seed=2, offset=0
    )
    assert torch.all(mask[0, samples.long()] == 1)
    assert torch.cosine_similarity(freq(samples, vocab), renormed[0], 0) > 0.99


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.__name__)
@pytest.mark.parametrize("k", [10, 100])
def test_top_k_sampling_freq(device, distribution, k):
    vocab = 111
    logits = distribution((1, vocab), device, torch.Generator().manual_seed(42))
    probs = torch.softmax(logits, -1)
    mask = top_k_mask(probs, torch.tensor([k], device=device))
    renormed = flashinfer.top_k_renorm_probs(probs, k)
    samples = flashinfer.top_k_sampling_from_probs(
        probs, k, indices=torch.zeros(TRIALS, dtype=torch.int32, device=device), seed=3, offset=0
    )
    assert torch.all(mask[0, samples.long()] == 1)
    assert torch.cosine_similarity(freq(samples, vocab), renormed[0], 0) > 0.99


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.__name__)
def test_sampling_from_logits_freq(device, distribution):
    vocab = 111
    logits = distribution((1, vocab), device, torch.Generator().manual_seed(42))
    samples = flashinfer.sampling_from_logits(
        logits, indices=torch.zeros(TRIALS, dtype=torch.int32, device=device), seed=4, offset=0
    )
    assert torch.cosine_similarity(freq(samples, vocab), torch.softmax(logits, -1)[0], 0) > 0.99


# ------------------------------------------------------------------ validity over trials


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_sampling(device, batch, vocab):
    probs = random_probs(batch, vocab, device)
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(1)).to(device)
    for _ in range(10):  # fresh seeds each call, drawn from torch's generator
        for samples in (
            flashinfer.sampling_from_probs(probs),
            flashinfer.sampling_from_logits(logits),
        ):
            assert samples.dtype == torch.int32 and samples.shape == (batch,)
            assert torch.all((samples >= 0) & (samples < vocab))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling(device, batch, vocab, p):
    probs = random_probs(batch, vocab, device)
    mask = top_p_mask(probs, p)
    rows = torch.arange(batch, device=device)
    for _ in range(5):
        samples = flashinfer.top_p_sampling_from_probs(probs, p)
        assert torch.all(mask[rows, samples.long()] == 1)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", [10, 100, 500])
@pytest.mark.parametrize("variable_k", [False, True])
def test_top_k_sampling(device, batch, vocab, k, variable_k):
    if k > vocab:
        pytest.skip("k should be less than vocab_size")
    probs = random_probs(batch, vocab, device)
    if variable_k:
        k = torch.randint(1, k + 1, (batch,), generator=torch.Generator().manual_seed(5)).to(device)
        mask = top_k_mask(probs, k)
    else:
        mask = top_k_mask(probs, torch.full((batch,), k, device=device))
    rows = torch.arange(batch, device=device)
    for _ in range(5):
        samples = flashinfer.top_k_sampling_from_probs(probs, k)
        assert torch.all(mask[rows, samples.long()] == 1)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("p", [0.05, 0.1, 0.2, 0.7, 1])
def test_min_p_sampling(device, batch, vocab, p):
    probs = random_probs(batch, vocab, device)
    mask = (probs >= p * probs.max(-1, keepdim=True).values).int()
    rows = torch.arange(batch, device=device)
    min_p = torch.full((batch,), p, device=device)
    for _ in range(5):
        samples = flashinfer.min_p_sampling_from_probs(probs, min_p)
        assert torch.all(mask[rows, samples.long()] == 1)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_joint_sampling_from_probs(device, batch, vocab, p):
    k = int(vocab * (0.5 if p == 0.1 else 0.1))
    probs = random_probs(batch, vocab, device)
    mask = torch.minimum(
        top_p_mask(probs, p), top_k_mask(probs, torch.full((batch,), k, device=device))
    )
    rows = torch.arange(batch, device=device)
    for _ in range(5):
        samples = flashinfer.top_k_top_p_sampling_from_probs(
            probs,
            torch.full((batch,), k, device=device),
            torch.full((batch,), p, device=device),
            filter_apply_order="joint",
        )
        assert torch.all(mask[rows, samples.long()] == 1)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_sampling_from_probs_logits_alignment(device, batch, vocab, p):
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(42)).to(device) * 5
    gen_logits = torch.Generator(device).manual_seed(7)
    gen_probs = torch.Generator(device).manual_seed(7)
    samples = flashinfer.top_k_top_p_sampling_from_logits(
        logits, 100, p, filter_apply_order="top_k_first", generator=gen_logits
    )
    reference = flashinfer.top_k_top_p_sampling_from_probs(
        torch.softmax(logits, -1), 100, p, filter_apply_order="top_k_first", generator=gen_probs
    )
    assert (samples == reference).float().mean() >= 0.99


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_top_k_top_p_joint_sampling_from_logits(device, batch, vocab, p):
    logits = torch.rand(batch, vocab, generator=torch.Generator().manual_seed(42)).to(device) * 5
    k = int(vocab * (0.5 if p == 0.1 else 0.1))
    samples = flashinfer.top_k_top_p_sampling_from_logits(
        logits, k, p, filter_apply_order="joint", generator=torch.Generator(device).manual_seed(9)
    )
    reference = flashinfer.top_k_top_p_sampling_from_probs(
        torch.softmax(logits, -1),
        k,
        p,
        filter_apply_order="joint",
        generator=torch.Generator(device).manual_seed(9),
    )
    assert torch.equal(samples, reference)


# ------------------------------------------------------------------ renormalisation, softmax


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1.0])
def test_top_p_renorm_probs(device, batch, vocab, p):
    probs = random_probs(batch, vocab, device)
    sorted_p, order = torch.sort(probs, descending=False)
    mask = torch.zeros_like(probs, dtype=torch.int32)
    mask.scatter_add_(1, order, (torch.cumsum(sorted_p, -1) >= (1 - p)).int())
    expected = torch.where(mask == 1, probs, torch.zeros_like(probs))
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(
        flashinfer.top_p_renorm_probs(probs, p), expected, rtol=1e-3, atol=1e-3
    )


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", [10, 100, 500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_renorm_probs(device, batch, vocab, k, dtype):
    if k > vocab:
        pytest.skip("k should be less than vocab_size")
    probs = random_probs(batch, vocab, device).to(dtype)
    mask = top_k_mask(probs.float(), torch.full((batch,), k, device=device))
    expected = torch.where(mask == 1, probs.float(), torch.zeros_like(probs.float()))
    expected = expected / expected.sum(-1, keepdim=True)
    renormed = flashinfer.top_k_renorm_probs(probs, k)
    assert renormed.dtype == dtype
    tol = 1e-3 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(renormed.float(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.1])
@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize("neg_inf_input", [True, False])
def test_softmax(device, batch, vocab, temperature, per_row, neg_inf_input):
    gen = torch.Generator().manual_seed(42)
    logits = torch.randn(batch, vocab, generator=gen)
    if neg_inf_input:  # random -inf entries, every row keeping a finite one
        logits[torch.rand(batch, vocab, generator=gen) < 0.3] = float("-inf")
        logits[:, 0] = 0.0
    logits = logits.to(device)
    t = torch.full((batch,), temperature, device=device) if per_row else temperature
    probs = flashinfer.softmax(logits, temperature=t)
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, -1), atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ chain speculative sampling


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("num_speculate_tokens", [1, 3, 5, 7])
@pytest.mark.parametrize("onehot_target", [False, True])
def test_chain_speculative_sampling(device, batch, vocab, num_speculate_tokens, onehot_target):
    if vocab == 32000 and batch == 99 and num_speculate_tokens > 3:
        pytest.skip("sizes cut on CPU")
    k = num_speculate_tokens
    gen = torch.Generator().manual_seed(k * 1000 + batch)
    draft_probs = torch.rand(batch, k, vocab, generator=gen)
    draft_probs = (draft_probs / draft_probs.sum(-1, keepdim=True)).to(device)
    draft_ids = torch.randint(vocab, (batch, k), generator=gen).to(device)
    if onehot_target:
        target_ids = torch.randint(vocab, (batch, k + 1), generator=gen).to(device)
        target_ids[:, :k] = draft_ids
        target_probs = torch.zeros(batch, k + 1, vocab, device=device)
        target_probs.scatter_(2, target_ids.unsqueeze(-1), 1)
    else:
        target_probs = torch.rand(batch, k + 1, vocab, generator=gen)
        target_probs = (target_probs / target_probs.sum(-1, keepdim=True)).to(device)
    for _ in range(3):
        accepted = torch.zeros(batch, dtype=torch.int32, device=device)
        emitted = torch.zeros(batch, dtype=torch.int32, device=device)
        out, accepted, emitted = flashinfer.sampling.chain_speculative_sampling(
            draft_probs, draft_ids, target_probs, accepted, emitted
        )
        assert out.dtype == torch.int32 and out.shape == (batch, k + 1)
        if onehot_target:
            assert torch.equal(out, target_ids.int())
        else:
            assert torch.all(out[out >= 0] < vocab)
            mismatch = out[:, :-1] != draft_ids
            for row in range(batch):
                where = torch.nonzero(mismatch[row]).flatten()
                if len(where):
                    assert torch.all(where[1:] == where[:-1] + 1)  # contiguous
                    assert torch.all(out[row, where[0] + 1 :] == -1)
        assert torch.all(emitted + 1 == (out != -1).sum(1))
        assert torch.all((accepted >= emitted) & (accepted <= k))


def test_chain_speculative_sampling_doc_example(device):
    """The docstring example of ``chain_speculative_sampling``: the first draft (target 0.6,
    draft 0.3) is always accepted, the second (target probability 0) always rejected and
    replaced from the residual, which is one-hot at token 0."""
    draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]], device=device)
    draft_ids = torch.tensor([[2, 1]], dtype=torch.int32, device=device)
    target_probs = torch.tensor(
        [[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]], device=device
    )
    out, accepted, emitted = flashinfer.chain_speculative_sampling(
        draft_probs, draft_ids, target_probs
    )
    assert out.tolist() == [[2, 0, -1]]
    assert accepted.tolist() == [1] and emitted.tolist() == [1]


def test_chain_counters_accumulate_in_place(device):
    probs = torch.full((2, 2, 5), 0.2, device=device)
    ids = torch.zeros(2, 2, dtype=torch.int64, device=device)
    accepted = torch.tensor([10, 20], dtype=torch.int32, device=device)
    emitted = torch.tensor([1, 2], dtype=torch.int32, device=device)
    _, a, e = flashinfer.chain_speculative_sampling(
        probs, ids, torch.full((2, 3, 5), 0.2, device=device), accepted, emitted
    )
    assert a is accepted and e is emitted
    # q = p: every draft accepted, counted once per call on top of the previous values
    assert accepted.tolist() == [12, 22] and emitted.tolist() == [3, 4]


# ------------------------------------------------------------------ parameters, seeds, NaN


@pytest.mark.parametrize(
    "call, value",
    [
        (lambda probs, v: flashinfer.min_p_sampling_from_probs(probs, v), 0.1),
        (lambda probs, v: flashinfer.top_p_renorm_probs(probs, v), 0.5),
        (lambda probs, v: flashinfer.top_k_renorm_probs(probs, v), 10),
    ],
    ids=["min_p", "top_p", "top_k"],
)
@pytest.mark.parametrize("batch", [1, 99])
def test_check_tensor_param(device, call, value, batch):
    probs = random_probs(batch, 111, device)
    assert call(probs, value).shape[0] == batch
    dtype = torch.float32 if isinstance(value, float) else torch.int32
    with pytest.raises(ValueError, match=r"Expected a 1D tensor or scalar.*got a 2D tensor"):
        call(probs, torch.full((batch, 111), value, dtype=dtype, device=device))
    with pytest.raises(
        ValueError,
        match=r"Expected a 1D tensor of shape \(batch_size,\) or scalar.*got a 0-dimensional",
    ):
        call(probs, torch.tensor(value, dtype=dtype, device=device))
    if batch > 1:
        with pytest.raises(ValueError, match="Sampling parameter.*batch size mismatch"):
            call(probs, torch.tensor([value], dtype=dtype, device=device))
    assert call(probs, torch.full((batch,), value, dtype=dtype, device=device)).shape[0] == batch


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_seed_offset_reproducibility(device, batch, vocab):
    probs = random_probs(batch, vocab, device)
    logits = torch.log(probs)
    assert torch.equal(
        flashinfer.sampling_from_probs(probs, seed=12345, offset=0),
        flashinfer.sampling_from_probs(probs, seed=12345, offset=0),
    )
    assert torch.equal(
        flashinfer.sampling_from_logits(logits, seed=12345, offset=0),
        flashinfer.sampling_from_logits(logits, seed=12345, offset=0),
    )
    seeds = torch.full((batch,), 12345, dtype=torch.int64, device=device)
    offsets = torch.zeros(batch, dtype=torch.int64, device=device)
    assert torch.equal(
        flashinfer.sampling_from_probs(probs, seed=seeds, offset=offsets),
        flashinfer.sampling_from_probs(probs, seed=12345, offset=0),
    )
    with pytest.raises(ValueError, match="both be tensors or both be scalars"):
        flashinfer.sampling_from_probs(probs, seed=seeds, offset=0)


@pytest.mark.parametrize("vocab", VOCABS)
def test_different_seed_offset_produces_different_results(device, vocab):
    probs = random_probs(1000, vocab, device)
    base = flashinfer.sampling_from_probs(probs, seed=12345, offset=0)
    assert (base == flashinfer.sampling_from_probs(probs, seed=67890, offset=0)).float().mean() < 1
    assert (
        base == flashinfer.sampling_from_probs(probs, seed=12345, offset=1000)
    ).float().mean() < 1


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(
    "sampling_type", ["from_probs", "from_logits", "top_p", "top_k", "min_p", "top_k_top_p"]
)
@pytest.mark.parametrize("indices_dtype", [torch.int32, torch.int64])
def test_indices_sampling(device, batch, sampling_type, indices_dtype):
    vocab = 111
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(42)).to(device)
    probs = torch.softmax(logits, -1)
    indices = torch.arange(batch, dtype=indices_dtype, device=device)
    samples = {
        "from_probs": lambda: flashinfer.sampling_from_probs(probs, indices=indices),
        "from_logits": lambda: flashinfer.sampling_from_logits(logits, indices=indices),
        "top_p": lambda: flashinfer.top_p_sampling_from_probs(probs, 0.9, indices=indices),
        "top_k": lambda: flashinfer.top_k_sampling_from_probs(probs, 100, indices=indices),
        "min_p": lambda: flashinfer.min_p_sampling_from_probs(probs, 0.1, indices=indices),
        "top_k_top_p": lambda: flashinfer.top_k_top_p_sampling_from_probs(
            probs, 100, 0.9, indices=indices, filter_apply_order="joint"
        ),
    }[sampling_type]()
    assert samples.dtype == indices_dtype and samples.shape == (batch,)
    assert torch.all((samples >= 0) & (samples < vocab))


@pytest.mark.parametrize("batch", [1, 4, 19])
def test_sampling_nan_input(device, batch):
    probs = random_probs(batch, 111, device)
    bad = sorted({0, batch // 2, batch - 1})
    probs[bad] = float("nan")
    good = [i for i in range(batch) if i not in bad]
    for result, valid in (
        flashinfer.sampling_from_probs(probs, return_valid=True),
        flashinfer.top_k_sampling_from_probs(probs, top_k=50, return_valid=True),
        flashinfer.top_p_sampling_from_probs(probs, top_p=0.9, return_valid=True),
        flashinfer.min_p_sampling_from_probs(probs, min_p=0.1, return_valid=True),
        flashinfer.top_k_top_p_sampling_from_probs(
            probs, top_k=50, top_p=0.9, filter_apply_order="joint", return_valid=True
        ),
    ):
        assert all(result[i] == 0 and not valid[i] for i in bad)
        assert all(valid[i] and 0 <= result[i] < 111 for i in good)
    with pytest.raises(ValueError, match="Input probs contains NaN"):
        flashinfer.sampling_from_probs(probs, check_nan=True)


def test_bad_shapes_and_orders(device):
    probs = random_probs(3, 11, device)
    with pytest.raises(ValueError, match=r"probs must be \[batch_size, vocab_size\]"):
        flashinfer.sampling_from_probs(probs[0])
    with pytest.raises(ValueError, match="Invalid filter_apply_order"):
        flashinfer.top_k_top_p_sampling_from_probs(probs, 2, 0.5, filter_apply_order="sideways")
    with pytest.raises(ValueError, match="shapes disagree"):
        flashinfer.chain_speculative_sampling(
            torch.rand(3, 2, 11, device=device),
            torch.zeros(3, 2, dtype=torch.int64, device=device),
            torch.rand(3, 2, 11, device=device),
        )
