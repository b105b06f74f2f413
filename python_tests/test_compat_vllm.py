"""vLLM's own rejection-sampler test cases, ported to :mod:`specdec_kernels.compat.vllm`.

Source: vllm-project/vllm ``tests/v1/sample/test_rejection_sampler.py``: the greedy cases
(perfect match, early mismatch, multiple sequences, single token, empty sequence, multiple
mismatches, the parametrized cases), the ragged batches among them, the seeded-determinism
case, the statistical case (rejection sampling approximates the target distribution) and the
top-k / top-p masking cases. vLLM mocks its sampler to supply the bonus tokens; here they are
passed as ``bonus_token_ids``. Each greedy case runs through both forms: the module
(:class:`RejectionSampler`, from logits) and the functional core (:func:`rejection_sample`,
from probabilities).
"""

import pytest
import torch
import torch.nn.functional as F

from python_tests.compat_helpers import device  # noqa: F401  (fixture)
from python_tests.sampling_cases import chi_square_pvalue
from specdec_kernels.compat.vllm import (
    MAX_SPEC_LEN,
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    SamplingMetadata,
    SpecDecodeMetadata,
    rejection_sample,
)

P = PLACEHOLDER_TOKEN_ID


def logits_for(output_tokens, vocab=100, dev="cpu", override=None):
    """vLLM's helper: logits whose argmax at each draft position is the wanted output."""
    rows = [tokens[:-1] for tokens in output_tokens]
    logits = torch.full((sum(len(r) for r in rows), vocab), -100.0, device=dev)
    start = 0
    for r in rows:
        for j, token in enumerate(r):
            logits[start + j, token] = 100.0
        start += len(r)
    if override:
        logits[:, override] = 99.0
    return logits


def run_both(spec_tokens, output_tokens, dev, metadata=None, draft_probs=None):
    """The module on logits and the functional core on probabilities; both must agree."""
    metadata = metadata or SamplingMetadata()
    logits = logits_for(output_tokens, dev=dev)
    bonus = torch.tensor([[t[-1]] for t in output_tokens], device=dev)
    spec = SpecDecodeMetadata.make_dummy(spec_tokens, device=dev)
    from_logits = RejectionSampler()(spec, draft_probs, logits, bonus, metadata)
    from_probs = rejection_sample(
        spec.draft_token_ids,
        spec.num_draft_tokens,
        spec.max_spec_len,
        spec.cu_num_draft_tokens,
        draft_probs,
        logits.softmax(-1),
        bonus,
        metadata,
    )
    assert from_logits.dtype == torch.int32
    assert torch.equal(from_logits, from_probs)
    return from_logits.tolist()


GREEDY_CASES = {
    "perfect_match": ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    "early_mismatch": ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, P, P]]),
    "multiple_sequences": ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, P]]),
    "single_token_sequence": ([[1]], [[1, 2]], [[1, 2]]),
    "empty_sequence": ([[]], [[5]], [[5]]),
    "multiple_mismatches": (
        [[1, 2, 3], [4, 5, 6]],
        [[1, 2, 7, 6], [4, 8, 6, 9]],
        [[1, 2, 7, P], [4, 8, P, P]],
    ),
    "parametrized_perfect_match_with_bonus": ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    "parametrized_first_mismatch": ([[1]], [[2, 3]], [[2, P]]),
    "parametrized_mixed_matches": (
        [[1, 2], [3, 4]],
        [[1, 5, 6], [3, 4, 7]],
        [[1, 5, P], [3, 4, 7]],
    ),
    # ragged beyond vLLM's cases: an empty request between two others
    "ragged_with_empty": (
        [[1, 2, 3], [], [4]],
        [[1, 2, 9, 4], [6], [4, 7]],
        [[1, 2, 9, P], [6, P, P, P], [4, 7, P, P]],
    ),
}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy(device, case):
    spec_tokens, output_tokens, expected = GREEDY_CASES[case]
    assert run_both(spec_tokens, output_tokens, device) == expected


def test_greedy_and_random_requests_in_one_batch(device):
    """Temperature 0 marks the greedy request (-1, vLLM's older marker, too); the random
    request with a one-hot target still behaves deterministically."""
    spec_tokens, output_tokens = [[1, 2], [3, 4], [5]], [[1, 7, 9], [3, 4, 8], [6, 2]]
    for marker in (0.0, -1.0):
        metadata = SamplingMetadata(
            temperature=torch.tensor([marker, 1.0, marker], device=device), all_greedy=False
        )
        assert run_both(spec_tokens, output_tokens, device, metadata) == [
            [1, 7, P],
            [3, 4, 8],
            [6, P, P],
        ]


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
@pytest.mark.parametrize("frac_seeded", [0.0, 0.5])
def test_deterministic_when_seeded(device, k, batch_size, frac_seeded):
    vocab, n_rep = 1000, 20
    gen = torch.Generator().manual_seed(k * 100 + batch_size)
    draft_probs = F.softmax(torch.rand(batch_size * k, vocab, generator=gen), -1).to(device)
    target_logits = torch.rand(batch_size * k, vocab, generator=gen).to(device)
    bonus = torch.randint(vocab, (batch_size, 1), generator=gen).to(device)
    drafts = torch.randint(vocab, (batch_size, k), generator=gen)
    seeded = torch.rand(batch_size, generator=gen) <= frac_seeded
    spec = SpecDecodeMetadata.make_dummy(drafts.tolist(), device=device)
    results = []
    for _ in range(n_rep):
        generators = {
            i: torch.Generator(device=device).manual_seed(i) for i in range(batch_size) if seeded[i]
        }
        metadata = SamplingMetadata(
            temperature=torch.ones(batch_size, device=device),
            all_greedy=False,
            all_random=True,
            generators=generators,
        )
        results.append(RejectionSampler()(spec, draft_probs, target_logits, bonus, metadata))
    for i in range(batch_size):
        if seeded[i]:
            assert all(torch.equal(r[i], results[0][i]) for r in results[1:])
    if frac_seeded == 0.0 and batch_size * k >= 8:  # unseeded requests do vary
        assert any(not torch.equal(r, results[0]) for r in results[1:])


def estimate_pdf(draft_probs, target_logits, k, vocab, num_samples, dev):
    """vLLM's estimate_rejection_sampling_pdf: histogram of the emitted draft positions."""
    draft = draft_probs.reshape(1, 1, vocab).repeat(num_samples, k, 1)
    targets = target_logits.reshape(1, vocab).repeat(num_samples * k, 1)
    drafts = torch.multinomial(draft[:, 0, :], num_samples=k, replacement=True).reshape(
        num_samples, k
    )
    spec = SpecDecodeMetadata.make_dummy(drafts.tolist(), device=dev)
    metadata = SamplingMetadata(
        temperature=torch.ones(num_samples, device=dev), all_greedy=False, all_random=True
    )
    bonus = torch.zeros(num_samples, 1, dtype=torch.int64, device=dev)
    out = RejectionSampler()(spec, draft.view(-1, vocab).to(dev), targets.to(dev), bonus, metadata)
    tokens = out[:, :-1].flatten().float().cpu()
    return torch.histogram(tokens, bins=vocab, range=(0, vocab), density=True).hist


def test_rejection_sampling_approximates_target_distribution(device):
    torch.manual_seed(0)
    vocab, k = 10, 2
    draft_probs = F.softmax(torch.rand(vocab), -1)
    target_logits = torch.rand(vocab)
    target_probs = F.softmax(target_logits, -1)
    reference = F.softmax(torch.rand(100, vocab), -1)
    to_target, to_reference = [], []
    for n in [10, 100, 1_000, 10_000, 100_000]:
        pdf = estimate_pdf(draft_probs, target_logits, k, vocab, n, device)
        to_reference.append(torch.dist(reference, pdf).item() / reference.shape[0])
        to_target.append(torch.dist(target_probs, pdf).item())
    improvement_target = to_target[0] / to_target[-1]
    improvement_reference = to_reference[0] / to_reference[-1]
    assert improvement_target > improvement_reference * 20


@pytest.mark.parametrize("use_draft_probs", [True, False])
def test_first_token_follows_the_target(device, use_draft_probs):
    """Sharper than vLLM's distance test: 200k single-draft requests, the first emitted token
    follows the target distribution (chi-square), with and without draft probabilities."""
    vocab, n = 10, 200_000
    gen = torch.Generator().manual_seed(3)
    q = F.softmax(2 * torch.randn(vocab, generator=gen), -1)
    p = F.softmax(2 * torch.randn(vocab, generator=gen), -1)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen)
    torch.manual_seed(11)
    out = rejection_sample(
        drafts.to(device),
        [1] * n,
        1,
        torch.arange(1, n + 1, device=device).int(),
        q.repeat(n, 1).to(device) if use_draft_probs else None,
        p.repeat(n, 1).to(device),
        torch.zeros(n, 1, dtype=torch.int64, device=device),
        SamplingMetadata(
            temperature=torch.ones(n, device=device), all_greedy=False, all_random=True
        ),
    )
    counts = torch.bincount(out[:, 0].long().cpu(), minlength=vocab)
    assert chi_square_pvalue(counts, p) > 1e-3


def masked_case(dev, metadata, target_logits, unmasked, batch_size=100, num_draft=3, vocab=100):
    gen = torch.Generator().manual_seed(5)
    draft_probs = F.softmax(torch.rand(batch_size * num_draft, vocab, generator=gen), -1)
    drafts = torch.multinomial(draft_probs, 1, generator=gen).reshape(batch_size, num_draft)
    spec = SpecDecodeMetadata.make_dummy(drafts.tolist(), device=dev)
    bonus = torch.zeros(batch_size, 1, dtype=torch.int64, device=dev)
    out = RejectionSampler()(spec, draft_probs.to(dev), target_logits, bonus, metadata)
    for i, token in enumerate(out[:, :-1].flatten().tolist()):
        if token != PLACEHOLDER_TOKEN_ID:
            assert token in unmasked[i]


@pytest.mark.parametrize("top_k", [1, 5, 99])
def test_top_k(device, top_k):
    vocab, batch_size, num_draft = 100, 100, 3
    gen = torch.Generator().manual_seed(top_k)
    top = torch.stack(
        [torch.randperm(vocab, generator=gen)[:top_k] for _ in range(batch_size * num_draft)]
    )
    logits = torch.zeros(batch_size * num_draft, vocab)
    for i in range(len(top)):
        logits[i, top[i]] += 0.1  # barely above the rest: only top-k masking excludes them
    metadata = SamplingMetadata(
        temperature=torch.ones(batch_size, device=device),
        all_greedy=False,
        all_random=True,
        top_k=torch.full((batch_size,), top_k, dtype=torch.int64, device=device),
    )
    masked_case(device, metadata, logits.to(device), [set(t.tolist()) for t in top])


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p(device, top_p):
    vocab, batch_size, num_draft = 100, 100, 3
    logits = torch.randn(batch_size * num_draft, vocab, generator=torch.Generator().manual_seed(1))
    sorted_logits, order = logits.sort(-1, descending=False)
    outside = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
    outside[:, -1] = False
    allowed = [set(order[i][~outside[i]].tolist()) for i in range(len(logits))]
    metadata = SamplingMetadata(
        temperature=torch.ones(batch_size, device=device),
        all_greedy=False,
        all_random=True,
        top_p=torch.full((batch_size,), top_p, device=device),
    )
    masked_case(device, metadata, logits.to(device), allowed)


def test_zero_draft_probability_is_rejected(device):
    """vLLM: "If it happens to be 0, we reject" (the recovered token comes from max(p - q, 0))."""
    q = torch.tensor([[0.0, 0.5, 0.5, 0.0]], device=device)
    p = torch.tensor([[0.7, 0.1, 0.1, 0.1]], device=device)
    for _ in range(20):
        out = rejection_sample(
            torch.tensor([0], device=device),
            [1],
            1,
            torch.tensor([1], device=device),
            q,
            p,
            torch.tensor([[3]], device=device),
            SamplingMetadata(
                temperature=torch.ones(1, device=device), all_greedy=False, all_random=True
            ),
        )
        assert out[0, 1] == P and out[0, 0] in (0, 3)


def test_limits_and_shapes(device):
    spec = SpecDecodeMetadata.make_dummy([[1, 2]], device=device)
    logits = logits_for([[1, 2, 3]], dev=device)
    with pytest.raises(ValueError, match="MAX_SPEC_LEN"):
        rejection_sample(
            spec.draft_token_ids,
            spec.num_draft_tokens,
            MAX_SPEC_LEN + 1,
            spec.cu_num_draft_tokens,
            None,
            logits.softmax(-1),
            torch.tensor([[3]], device=device),
            SamplingMetadata(),
        )
    with pytest.raises(ValueError, match="num_tokens=2"):
        rejection_sample(
            spec.draft_token_ids,
            spec.num_draft_tokens,
            2,
            spec.cu_num_draft_tokens,
            None,
            logits[:1].softmax(-1),
            torch.tensor([[3]], device=device),
            SamplingMetadata(),
        )
    with pytest.raises(ValueError, match="draft_probs must be"):
        RejectionSampler()(
            spec,
            torch.rand(3, 100, device=device),
            logits,
            torch.tensor([[3]], device=device),
            SamplingMetadata(),
        )
