"""Input builders shared by the sampling and verification tests."""

from __future__ import annotations

import torch

from specdec_kernels.sampling import SamplingParams

# Seeds whose Philox words are 0 or 2^24 - 1 in their top 24 bits at offset 0 (found by an
# exhaustive search; each test re-checks them with reference.uniforms before relying on them).
SEED_SAMPLE_U_MAX = 10464992  # ops.sample stream, position 0: sampling uniform = 1 - 2^-24
SEED_ACCEPT_U0_POS1 = 2210430  # verify stream, position 1: acceptance uniform = 0
SEED_ACCEPT_U_MAX_POS1 = 7935899  # verify stream, position 1: acceptance uniform = 1 - 2^-24
SEED_SAMPLE_U0_POS0 = 10710051  # verify stream, position 0: sampling uniform = 0
SEED_SAMPLE_U_MAX_POS0 = 17845651  # verify stream, position 0: sampling uniform = 1 - 2^-24


def random_params(batch: int, gen: torch.Generator, device="cpu", greedy_fraction=0.2) -> SamplingParams:
    """A mix of greedy rows and sampling rows with every filter on or off."""

    def pick(on_probability, on, off):
        return torch.where(torch.rand(batch, generator=gen) < on_probability, on, off)

    temperature = pick(1 - greedy_fraction, 0.3 + 1.5 * torch.rand(batch, generator=gen), torch.zeros(batch))
    return SamplingParams.create(
        batch,
        temperature=temperature,
        top_k=pick(0.4, torch.randint(1, 40, (batch,), generator=gen), torch.zeros(batch, dtype=torch.int64)),
        top_p=pick(0.4, 0.3 + 0.69 * torch.rand(batch, generator=gen), torch.ones(batch)),
        min_p=pick(0.3, 0.2 * torch.rand(batch, generator=gen), torch.zeros(batch)),
        seed=torch.randint(0, 2**62, (batch,), generator=gen),
        device=device,
    )


def random_logits(shape, dtype, gen, scale=3.0, device="cpu"):
    return (scale * torch.randn(shape, generator=gen)).to(dtype).to(device)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of observed counts against expected probabilities (categories
    with zero probability must have zero counts; categories expected below 5 are pooled)."""
    counts = counts.double().cpu()
    probs = probs.double().cpu()
    assert int(counts[probs == 0].sum()) == 0, "a token of probability 0 was emitted"
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if obs.numel() < 2:
        return 1.0
    exp = exp * (obs.sum() / exp.sum())
    statistic = ((obs - exp) ** 2 / exp).sum()
    dof = torch.tensor(float(obs.numel() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))  # chi-square survival function


def random_chain(batch, k, vocab, dtype, gen, device="cpu", accept_bias=0.6, with_probs=True):
    """Drafts, ragged num_draft, target logits where drafts are often the argmax (sometimes
    tied with another token), and draft distributions that favour their drafts."""
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    num_draft = torch.randint(0, k + 1, (batch,), generator=gen)
    logits = 2.0 * torch.randn(batch, k + 1, vocab, generator=gen)
    for b in range(batch):
        for i in range(k):
            r = float(torch.rand((), generator=gen))
            if r < accept_bias:
                logits[b, i, drafts[b, i]] = logits[b, i].max() + (0.0 if r < accept_bias / 4 else 1.0)
    probs = None
    if with_probs:
        probs = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
        probs.scatter_add_(2, drafts[:, :, None], torch.rand(batch, k, 1, generator=gen))
        probs /= probs.sum(-1, keepdim=True)
        probs = probs.to(device)
    return drafts.to(device), num_draft.to(device), logits.to(dtype).to(device), probs


def random_parents(num_nodes, gen, pad_probability=0.15):
    """A valid parent array: -1 at node 0, parent < child, some padding (-2) nodes that are
    nobody's parent."""
    parents = [-1]
    for j in range(1, num_nodes):
        valid = [i for i in range(j) if parents[i] != -2]
        if float(torch.rand((), generator=gen)) < pad_probability:
            parents.append(-2)
        else:
            parents.append(valid[int(torch.randint(0, len(valid), (), generator=gen))])
    return parents


def random_tree(batch, num_nodes, vocab, dtype, gen, device="cpu", accept_bias=0.5, with_probs=True):
    """Random trees (some siblings share a token), target logits favouring their children."""
    parents = torch.tensor([random_parents(num_nodes, gen) for _ in range(batch)])
    tokens = torch.randint(0, vocab, (batch, num_nodes), generator=gen)
    for b in range(batch):  # duplicate sibling tokens now and then
        for j in range(2, num_nodes):
            if parents[b, j] >= 0 and parents[b, j - 1] == parents[b, j] and float(torch.rand((), generator=gen)) < 0.3:
                tokens[b, j] = tokens[b, j - 1]
    logits = 2.0 * torch.randn(batch, num_nodes, vocab, generator=gen)
    for b in range(batch):
        for j in range(1, num_nodes):
            p = int(parents[b, j])
            if p >= 0 and float(torch.rand((), generator=gen)) < accept_bias:
                logits[b, p, tokens[b, j]] = logits[b, p].max() + 1.0
    probs = None
    if with_probs:
        probs = torch.softmax(torch.randn(batch, num_nodes, vocab, generator=gen), -1)
        probs.scatter_add_(2, tokens[:, :, None], torch.rand(batch, num_nodes, 1, generator=gen))
        probs /= probs.sum(-1, keepdim=True)
        probs = probs.to(device)
    return tokens.to(device), parents.to(device), logits.to(dtype).to(device), probs
