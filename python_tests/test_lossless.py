"""Losslessness of rejection-sampling verification, by frequency tests over 10^6 requests per
configuration (one batch of identical requests with seeds 0..10^6-1, drafts drawn from q with a
fixed generator): the first emitted token must follow the processed target distribution p
(Pearson chi-square, p-value > 1e-3 at these fixed seeds), and the first draft's acceptance
rate must equal sum_x min(p(x), q(x)) (within 5 standard errors)."""

import pytest
import torch

from python_tests.sampling_cases import chi_square_pvalue
from specdec_kernels import ops
from specdec_kernels.sampling import SamplingParams

N = 10**6
VOCAB = 16


def processed(logits_row, device, **kwargs):
    """The processed target distribution of one row (what a sampler draws from)."""
    params = SamplingParams.create(1, device=device, **kwargs)
    return ops.sample_with_probs(logits_row[None].to(device), params)[1][0].cpu()


def draft_distribution(kind, p, gen):
    if kind == "p":
        return p.clone()
    if kind == "disjoint":  # all of q's mass where p is 0
        outside = (p == 0).float()
        assert outside.sum() > 0
        return outside / outside.sum()
    if kind == "peaked":
        return torch.softmax(4.0 * torch.randn(VOCAB, generator=gen), 0)
    if kind == "flat":
        return torch.full((VOCAB,), 1.0 / VOCAB)
    raise ValueError(kind)


def batch_of(rows, n=N):
    """[n, *rows.shape] copies of the same rows."""
    return rows.expand(n, *rows.shape).contiguous()


def assert_follows(tokens, probs, what):
    counts = torch.bincount(tokens.cpu(), minlength=VOCAB)
    pvalue = chi_square_pvalue(counts, probs)
    assert pvalue > 1e-3, f"{what}: chi-square p-value {pvalue:.2e}\ncounts {counts.tolist()}\nprobs {probs.tolist()}"


def assert_rate(observed_mask, expected, what):
    rate = float(observed_mask.float().mean())
    tolerance = 5 * (max(expected * (1 - expected), 1e-12) / observed_mask.numel()) ** 0.5 + 1e-6
    assert abs(rate - expected) <= tolerance, f"{what}: acceptance {rate:.5f}, expected {expected:.5f}"


CHAIN_CASES = {
    "q=p, temperature and top-k": (dict(temperature=0.7, top_k=6), "p"),
    "q disjoint, top-p": (dict(temperature=1.0, top_p=0.7), "disjoint"),
    "one-hot drafts, temperature": (dict(temperature=1.3), None),
    "q peaked, top-k and top-p": (dict(temperature=0.9, top_k=10, top_p=0.9), "peaked"),
    "q flat, min-p": (dict(temperature=1.1, min_p=0.05), "flat"),
}


@pytest.mark.parametrize("case", list(CHAIN_CASES))
def test_chain_is_lossless(device, case):
    kwargs, q_kind = CHAIN_CASES[case]
    gen = torch.Generator().manual_seed(sorted(CHAIN_CASES).index(case))
    k = 2
    rows = 2.0 * torch.randn(k + 1, VOCAB, generator=gen)
    p = [processed(rows[i], device, **kwargs) for i in range(k + 1)]
    if q_kind is None:
        q = None
        drafts = torch.randint(0, VOCAB, (N, k), generator=gen)  # any fixed drafts
    else:
        q = torch.stack([draft_distribution(q_kind, p[i], gen) for i in range(k)])
        drafts = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=gen) for i in range(k)], 1)
    params = SamplingParams.create(N, seed=torch.arange(N), device=device, **kwargs)
    tokens, num_accepted = ops.verify_chain(
        drafts.to(device), None, batch_of(rows).to(device), None if q is None else batch_of(q).to(device), params
    )
    assert_follows(tokens[:, 0], p[0], f"{case}, first token")
    if q is None:
        expected = float(p[0][drafts[:, 0]].double().mean())
    else:
        expected = float(torch.minimum(p[0], q[0]).sum())
    assert_rate(num_accepted >= 1, expected, case)
    if case == "q peaked, top-k and top-p":  # after an accepted draft the next token follows p_1
        assert_follows(tokens[num_accepted >= 1, 1], p[1], f"{case}, second token")


# node 0 (root) has children 1, 2, 3 (tried in that order); node 4 is a child of node 1
TREE_PARENTS = [-1, 0, 0, 0, 1]
TREE_CASES = {
    "iid peaked q, temperature": (dict(temperature=0.8), "iid"),
    "one-hot distinct children, top-k": (dict(temperature=1.2, top_k=7), None),
    "q=p children, top-p": (dict(temperature=1.0, top_p=0.8), "p"),
    "a different q per child, top-k and min-p": (dict(temperature=1.5, top_k=12, min_p=0.03), "mixed"),
}


@pytest.mark.parametrize("case", list(TREE_CASES))
def test_tree_is_lossless(device, case):
    kwargs, q_kind = TREE_CASES[case]
    gen = torch.Generator().manual_seed(100 + sorted(TREE_CASES).index(case))
    num_nodes = len(TREE_PARENTS)
    rows = 2.0 * torch.randn(num_nodes, VOCAB, generator=gen)
    p_root = processed(rows[0], device, **kwargs)
    p_one = processed(rows[1], device, **kwargs)
    tokens = torch.zeros(N, num_nodes, dtype=torch.int64)
    if q_kind is None:  # three distinct fixed children
        children = torch.randperm(VOCAB, generator=gen)[:3]
        tokens[:, 1:4] = children
        tokens[:, 4] = int(torch.randint(0, VOCAB, (), generator=gen))
        q = None
    else:
        if q_kind == "iid":
            shared = draft_distribution("peaked", p_root, gen)
            child_q = [shared, shared, shared]
        elif q_kind == "p":
            child_q = [p_root, p_root, p_root]
        else:
            child_q = [draft_distribution(kind, p_root, gen) for kind in ("peaked", "flat", "peaked")]
        q = torch.zeros(num_nodes, VOCAB)
        q[1:4] = torch.stack(child_q)
        q[4] = draft_distribution("peaked", p_one, gen)
        for j in range(1, num_nodes):
            tokens[:, j] = torch.multinomial(q[j], N, replacement=True, generator=gen)
    parents = torch.tensor(TREE_PARENTS).expand(N, num_nodes).contiguous()
    params = SamplingParams.create(N, seed=torch.arange(N), device=device, **kwargs)
    nodes, out, _ = ops.verify_tree(
        tokens.to(device), parents.to(device), batch_of(rows).to(device),
        None if q is None else batch_of(q).to(device), params,
    )
    assert_follows(out[:, 0], p_root, f"{case}, first token")
    first_child_accepted = nodes[:, 0] == 1
    if q is None:
        for child, token in zip((1, 2, 3), children.tolist()):  # each child wins with p(token)
            assert_rate(nodes[:, 0] == child, float(p_root[token]), f"{case}, child {child}")
    else:
        assert_rate(first_child_accepted, float(torch.minimum(p_root, q[1]).sum()), case)
    assert_follows(out[first_child_accepted, 1], p_one, f"{case}, token after node 1")
