"""Sampling losslessness: with tiny random models over a 5-token vocabulary, the sequences
every method generates follow the exact distribution of the target's processed
(temperature / top-k / top-p) autoregressive sampling. Thousands of requests, each with its
own seed, run as one ragged batch; a chi-square test (fixed seeds, so deterministic) compares
the counts of every 3-token continuation with their exact probabilities. On every device
(CUDA too where built): the engine's sampling, verification and KV compaction run there."""

import itertools

import pytest
import torch

from python_tests.conftest import DEVICES
from python_tests.decoding_helpers import tiny_model, truncated_copy
from specdec_kernels.decoding import (
    DraftModelDrafter,
    JacobiDrafter,
    LookaheadDrafter,
    PromptLookupDrafter,
    SelfSpeculativeDrafter,
    generate,
)

VOCAB = 5
NEW = 3
PER_CONFIG = 3000
PROMPT = [1, 2, 3, 1, 2, 4, 1, 2]
# (temperature, top_k, top_p) per third of the batch: per-request parameters in one run.
CONFIGS = [(0.8, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.75)]


def processed(logits, temperature, top_k, top_p):
    """Temperature, then top-k, then top-p (smallest top set with mass >= top_p)."""
    probs = torch.softmax(logits.double() / temperature, -1)
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, -1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, 0)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1:
        sp, si = probs.sort(-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p
        probs = torch.zeros_like(probs).scatter(-1, si, sp * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@torch.inference_mode()
def exact_distribution(model, config):
    """Probability of every continuation of NEW tokens, by enumeration."""
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW)))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(seqs), -1), seqs], 1).to(model.device)
    logits = model(ids).logits[:, len(PROMPT) - 1 : -1].cpu()  # [S, NEW, V]
    probs = processed(logits, *config)
    return probs.gather(-1, seqs[..., None]).squeeze(-1).prod(-1)


def chi_square_pvalue(counts, probs):
    """Goodness of fit; cells expected below 5 are pooled."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), stat / 2)), float(stat), dof


def counts_of(sequences):
    index = torch.tensor(
        [sum(t * VOCAB ** (NEW - 1 - i) for i, t in enumerate(s)) for s in sequences]
    )
    return torch.bincount(index, minlength=VOCAB**NEW).double()


@pytest.fixture(scope="module", params=DEVICES)
def target(request):
    return tiny_model("llama", vocab=VOCAB, layers=3, seed=11).to(request.param)


def make_drafter(name, model):
    if name == "autoregressive":
        return None
    if name == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=2, max_depth=3, max_branches=3)
    if name == "self-speculative":
        return SelfSpeculativeDrafter(num_layers=1, num_draft=2)
    if name == "draft-model-truncated":
        return DraftModelDrafter(truncated_copy(model, 1).to(model.device), num_draft=2)
    if name == "draft-model-independent":
        other = tiny_model("llama", vocab=VOCAB, layers=1, seed=99).to(model.device)
        return DraftModelDrafter(other, num_draft=3)
    if name == "draft-model-restricted":  # its head scores tokens 0..2 only: 3 and 4 never drafted
        return DraftModelDrafter(truncated_copy(model, 1).to(model.device), num_draft=2,
                                 draft_vocab=3)
    if name == "lookahead":
        return LookaheadDrafter(3, 3, 3)
    if name == "jacobi":
        return JacobiDrafter(2)
    raise ValueError(name)


@pytest.fixture(scope="module")
def exact(target):
    return [exact_distribution(target, c) for c in CONFIGS]


def run_batch(model, drafter, seed_base=0):
    temps, ks, ps = zip(*[c for c in CONFIGS for _ in range(PER_CONFIG)])
    n = len(temps)
    out = generate(
        model,
        [PROMPT] * n,
        drafter=drafter,
        max_new_tokens=NEW,
        temperature=list(temps),
        top_k=list(ks),
        top_p=list(ps),
        seed=[seed_base + i for i in range(n)],
        eos_token_id=[],
    )
    return out


def assert_follows_target(out, exact, label=""):
    """Every config's ``PER_CONFIG`` sequences of ``run_batch``'s output fit the exact
    distribution of that config (chi-square, p > 1e-3)."""
    assert all(len(t) == NEW for t in out.tokens)
    for c, probs in enumerate(exact):
        seqs = out.tokens[c * PER_CONFIG : (c + 1) * PER_CONFIG]
        p, stat, dof = chi_square_pvalue(counts_of(seqs), probs)
        assert p > 1e-3, f"{label}config {CONFIGS[c]}: chi2 {stat:.1f} on {dof} dof, p={p:.2e}"


@pytest.mark.parametrize(
    "name",
    [
        "autoregressive",
        "prompt-lookup",
        "self-speculative",
        "draft-model-truncated",
        "draft-model-independent",
        "draft-model-restricted",
        "lookahead",
        "jacobi",
    ],
)
def test_sampled_sequences_follow_the_target_distribution(target, exact, name):
    out = run_batch(target, make_drafter(name, target))
    assert_follows_target(out, exact, f"{name}, ")
    if name != "autoregressive":  # the drafts were really used
        assert out.stats.tau > 1.05


def test_the_test_has_power(target, exact):
    """The same samples are rejected against a slightly different distribution."""
    out = run_batch(target, None)
    seqs = out.tokens[:PER_CONFIG]
    wrong = exact_distribution(target, (1.0, 0, 1.0))  # temperature 1.0 instead of 0.8
    p, _, _ = chi_square_pvalue(counts_of(seqs), wrong)
    assert p < 1e-6


@pytest.mark.parametrize(
    "name", ["autoregressive", "prompt-lookup", "draft-model-truncated", "draft-model-restricted",
             "lookahead", "jacobi"]
)
def test_a_request_does_not_depend_on_its_batch(target, name):
    """Same seed, same output, whether the request runs alone or among others."""
    prompts = [PROMPT, PROMPT[:5], PROMPT + [0, 4, 3]]
    kwargs = dict(max_new_tokens=12, temperature=1.0, seed=[5, 6, 7], eos_token_id=[])
    together = generate(target, prompts, drafter=make_drafter(name, target), **kwargs)
    for i, prompt in enumerate(prompts):
        alone = generate(
            target, [prompt], drafter=make_drafter(name, target),
            max_new_tokens=12, temperature=1.0, seed=[5 + i], eos_token_id=[],
        )
        assert alone.tokens[0] == together.tokens[i]


def test_seeds_reproduce_and_differ(target):
    a = generate(target, [PROMPT] * 2, max_new_tokens=16, temperature=1.0, seed=[1, 2])
    b = generate(target, [PROMPT] * 2, max_new_tokens=16, temperature=1.0, seed=[1, 2])
    assert a.tokens == b.tokens
    assert a.tokens[0] != a.tokens[1]
