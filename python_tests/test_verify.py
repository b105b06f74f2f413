"""Verification ops (chains, trees, typical acceptance) vs the reference and independent
formulas: greedy exactness, decision agreement, invariants, edge cases, opcheck,
torch.compile and bad input. Statistical losslessness is in test_lossless.py."""

import math

import pytest
import torch

from python_tests.conftest import DEVICES, FLOAT_DTYPES
from python_tests.sampling_cases import (
    SEED_ACCEPT_U0_POS1,
    SEED_ACCEPT_U_MAX_POS1,
    SEED_SAMPLE_U0_POS0,
    SEED_SAMPLE_U_MAX_POS0,
    random_chain,
    random_logits,
    random_params,
    random_tree,
)
from specdec_kernels import ops, reference
from specdec_kernels.sampling import SamplingParams


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == torch.int64 and g.device == w.device
        assert torch.equal(g, w), f"\n{g}\n!=\n{w}"


def path_tree(num_draft, k):
    """The parents of verify_chain's path tree: 0 -> 1 -> ... -> num_draft, padding after."""
    return [-1] + list(range(num_draft)) + [-2] * (k - num_draft)


def chain_as_tree(drafts, num_draft, logits, probs):
    batch, k = drafts.shape
    parents = torch.tensor([path_tree(int(n), k) for n in num_draft.cpu()], device=drafts.device)
    tokens = torch.cat([torch.zeros_like(drafts[:, :1]), drafts], 1)
    tree_probs = None if probs is None else torch.cat([torch.zeros_like(probs[:, :1]), probs], 1)
    return tokens, parents, logits, tree_probs


# ----------------------------------------------------------------------------- greedy


def greedy_chain_by_hand(drafts, num_draft, logits):
    """Accept while the draft is the argmax (first maximal id), then emit the argmax."""
    out = torch.full((drafts.shape[0], drafts.shape[1] + 1), -1)
    accepted = torch.zeros(drafts.shape[0], dtype=torch.int64)
    for b in range(drafts.shape[0]):
        row_argmax = [int(torch.argmax(logits[b, i].float().cpu())) for i in range(drafts.shape[1] + 1)]
        n = 0
        while n < int(num_draft[b]) and int(drafts[b, n]) == row_argmax[n]:
            out[b, n] = drafts[b, n]
            n += 1
        out[b, n] = row_argmax[n]
        accepted[b] = n
    return out, accepted


# Shapes of the reference comparisons (also run by the CUDA kernels' emulation).
GREEDY_CHAIN_K = [0, 1, 5]
GREEDY_TREE_NODES = [1, 2, 9, 26]
CHAIN_VOCABS = [1, 50, 1031]
TREE_NODES = [1, 7, 30]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", GREEDY_CHAIN_K)
def test_greedy_chain_exact(device, gen, dtype, k):
    batch, vocab = 33, 97
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, dtype, gen, device)
    params = SamplingParams.create(batch, temperature=0.0, top_k=5, top_p=0.5, device=device)
    got = ops.verify_chain(drafts, num_draft, logits, probs, params)
    by_hand = greedy_chain_by_hand(drafts.cpu(), num_draft.cpu(), logits.cpu())
    assert_same(got, tuple(t.to(device) for t in by_hand))
    assert_same(got, reference.verify_chain(drafts, num_draft, logits, probs, params))


def test_greedy_ties_are_broken_toward_the_lowest_id(device):
    # row 0: tokens 2 and 5 tie for the maximum -> the argmax is 2, a draft of 5 is rejected.
    logits = torch.zeros(2, 3, 8)
    logits[:, 0, 2] = logits[:, 0, 5] = 4.0
    logits[:, 1, 7] = 1.0
    drafts = torch.tensor([[2, 7], [5, 7]])
    params = SamplingParams.create(2, device=device)
    for dtype in FLOAT_DTYPES:
        tokens, n = ops.verify_chain(drafts.to(device), None, logits.to(dtype).to(device), None, params)
        assert tokens.tolist() == [[2, 7, 0], [2, -1, -1]] and n.tolist() == [2, 0]


def greedy_tree_by_hand(tokens, parents, logits):
    """Every root-to-node path whose tokens are all their parent's argmax; the longest (lowest
    final index on ties); then the argmax of its last node."""
    batch, num_nodes = tokens.shape
    nodes_out = torch.full((batch, num_nodes), -1)
    tokens_out = torch.full((batch, num_nodes), -1)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        par = parents[b].tolist()
        am = [int(torch.argmax(logits[b, j].float())) for j in range(num_nodes)]

        def path(j):
            nodes = []
            while j != 0:
                nodes.append(j)
                j = par[j]
            return nodes[::-1]

        best = []
        for j in range(1, num_nodes):
            if par[j] == -2:
                continue
            p = path(j)
            if all(int(tokens[b, c]) == am[par[c]] for c in p) and len(p) > len(best):
                best = p
        n = len(best)
        nodes_out[b, :n] = torch.tensor(best, dtype=torch.int64)
        tokens_out[b, :n] = tokens[b, best]
        tokens_out[b, n] = am[best[-1] if best else 0]
        accepted[b] = n
    return nodes_out, tokens_out, accepted


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_nodes", GREEDY_TREE_NODES)
def test_greedy_tree_exact(device, gen, dtype, num_nodes):
    batch, vocab = 21, 61
    tokens, parents, logits, probs = random_tree(batch, num_nodes, vocab, dtype, gen, device)
    params = SamplingParams.create(batch, temperature=0.0, device=device)
    got = ops.verify_tree(tokens, parents, logits, probs, params)
    by_hand = greedy_tree_by_hand(tokens.cpu(), parents.cpu(), logits.cpu())
    assert_same(got, tuple(t.to(device) for t in by_hand))
    assert_same(got, reference.verify_tree(tokens, parents, logits, probs, params))


def test_greedy_tree_takes_the_longest_path_over_the_first_match(device):
    """Two siblings carry the argmax token; only the second one's subtree continues."""
    vocab = 6
    parents = torch.tensor([[-1, 0, 0, 2, 3]], device=device)
    tokens = torch.tensor([[0, 4, 4, 1, 2]], device=device)
    logits = torch.zeros(1, 5, vocab)
    logits[0, 0, 4] = 3.0  # root predicts 4: nodes 1 and 2 both pass
    logits[0, 2, 1] = 3.0  # node 2 predicts 1: node 3 passes
    logits[0, 3, 2] = 3.0  # node 3 predicts 2: node 4 passes
    logits[0, 4, 5] = 3.0
    logits[0, 1, 0] = 3.0
    nodes, toks, n = ops.verify_tree(tokens, parents, logits.to(device), None, SamplingParams.create(1, device=device))
    assert nodes.tolist() == [[2, 3, 4, -1, -1]] and toks.tolist() == [[4, 1, 2, 5, -1]] and n.tolist() == [3]


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("vocab", CHAIN_VOCABS)
def test_chain_matches_reference(device, gen, dtype, with_probs, vocab):
    batch, k = 40, 4
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, dtype, gen, device, with_probs=with_probs)
    params = random_params(batch, gen, device)
    offset = torch.randint(0, 2**40, (batch,), generator=gen).to(device)
    got = ops.verify_chain(drafts, num_draft, logits, probs, params, offset)
    assert_same(got, reference.verify_chain(drafts, num_draft, logits, probs, params, offset))
    # The chain is verified exactly like its path tree.
    _, tree_tokens, tree_n = ops.verify_tree(*chain_as_tree(drafts, num_draft, logits, probs), params, offset)
    assert torch.equal(tree_tokens[:, : k + 1], got[0]) and torch.equal(tree_n, got[1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("num_nodes", TREE_NODES)
def test_tree_matches_reference(device, gen, dtype, with_probs, num_nodes):
    batch, vocab = 30, 211
    tokens, parents, logits, probs = random_tree(batch, num_nodes, vocab, dtype, gen, device, with_probs=with_probs)
    params = random_params(batch, gen, device)
    offset = torch.randint(0, 2**40, (batch,), generator=gen).to(device)
    got = ops.verify_tree(tokens, parents, logits, probs, params, offset)
    assert_same(got, reference.verify_tree(tokens, parents, logits, probs, params, offset))


def test_wide_tree_with_many_rejections(device, gen):
    """Ten children per node drafted from flat q: long chains of residual updates."""
    batch, vocab = 16, 40
    parents = torch.tensor([-1] + [0] * 10 + [1] * 10).repeat(batch, 1)
    tokens = torch.randint(0, vocab, parents.shape, generator=gen)
    logits = random_logits((batch, 21, vocab), torch.float32, gen)
    probs = torch.softmax(0.3 * torch.randn(batch, 21, vocab, generator=gen), -1)
    params = random_params(batch, gen, greedy_fraction=0.0)
    for q in [None, probs]:
        args = (tokens.to(device), parents.to(device), logits.to(device), None if q is None else q.to(device))
        got = ops.verify_tree(*args, params.to(device))
        assert_same(got, reference.verify_tree(*args, params.to(device)))


# ----------------------------------------------------------------------------- invariants


def check_chain_invariants(drafts, num_draft, tokens, num_accepted):
    for b in range(drafts.shape[0]):
        n = int(num_accepted[b])
        assert 0 <= n <= int(num_draft[b])
        assert tokens[b, :n].tolist() == drafts[b, :n].tolist()
        assert int(tokens[b, n]) >= 0
        assert (tokens[b, n + 1 :] == -1).all()


def test_chain_invariants_and_ragged_rows(device, gen):
    batch, k, vocab = 64, 6, 300
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, torch.float32, gen, device)
    params = random_params(batch, gen, device)
    tokens, num_accepted = ops.verify_chain(drafts, num_draft, logits, probs, params)
    check_chain_invariants(drafts.cpu(), num_draft.cpu(), tokens.cpu(), num_accepted.cpu())
    assert 0 < int(num_accepted.sum()) < int(num_draft.sum())  # the test exercises both outcomes
    # Rows and draft columns past num_draft are never read: poison them.
    poisoned_logits, poisoned_drafts, poisoned_probs = logits.clone(), drafts.clone(), probs.clone()
    for b in range(batch):
        n = int(num_draft[b])
        poisoned_logits[b, n + 1 :] = float("nan")
        poisoned_drafts[b, n:] = -7
        poisoned_probs[b, n:] = float("nan")
    again = ops.verify_chain(poisoned_drafts, num_draft, poisoned_logits, poisoned_probs, params)
    assert_same(again, (tokens, num_accepted))
    # A request's result does not depend on the rest of the batch.
    perm = torch.randperm(batch, generator=gen).to(device)
    permuted = ops.verify_chain(drafts[perm], num_draft[perm], logits[perm], probs[perm], params.select(perm))
    assert_same(permuted, (tokens[perm], num_accepted[perm]))


def test_tree_invariants(device, gen):
    batch, num_nodes, vocab = 40, 15, 120
    tokens, parents, logits, probs = random_tree(batch, num_nodes, vocab, torch.bfloat16, gen, device)
    params = random_params(batch, gen, device)
    nodes, out, n = ops.verify_tree(tokens, parents, logits, probs, params)
    nodes, out, n, parents_c, tokens_c = nodes.cpu(), out.cpu(), n.cpu(), parents.cpu(), tokens.cpu()
    for b in range(batch):
        m = int(n[b])
        path = nodes[b, :m].tolist()
        assert all(parents_c[b, c] == (path[i - 1] if i else 0) for i, c in enumerate(path))
        assert out[b, :m].tolist() == tokens_c[b, path].tolist()
        assert int(out[b, m]) >= 0 and (out[b, m + 1 :] == -1).all() and (nodes[b, m:] == -1).all()
    perm = torch.randperm(batch, generator=gen)  # indexes the host copies below
    on_device = perm.to(device)
    again = ops.verify_tree(tokens[on_device], parents[on_device], logits[on_device], probs[on_device],
                            params.select(on_device))
    assert_same(again, (nodes[perm].to(device), out[perm].to(device), n[perm].to(device)))


def test_mixed_greedy_and_sampling_rows_share_a_batch(device, gen):
    batch, k, vocab = 12, 3, 64
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, torch.float16, gen, device)
    params = SamplingParams.create(batch, temperature=[0.0, 1.0] * 6, top_k=[0, 10] * 6, seed=torch.arange(batch), device=device)
    tokens, n = ops.verify_chain(drafts, num_draft, logits, probs, params)
    greedy_rows = torch.arange(0, batch, 2, device=device)
    by_hand = greedy_chain_by_hand(drafts[greedy_rows].cpu(), num_draft[greedy_rows].cpu(), logits[greedy_rows].cpu())
    assert_same((tokens[greedy_rows].cpu(), n[greedy_rows].cpu()), by_hand)


# ----------------------------------------------------------------------------- edge cases


def one_step(device, target_row, q_row, draft, seed, **kwargs):
    """verify_chain of one draft (K = 1) with explicit p-row logits and q."""
    logits = torch.stack([target_row, torch.zeros_like(target_row)])[None].to(device)
    probs = None if q_row is None else q_row[None, None].to(device)
    params = SamplingParams.create(1, temperature=1.0, seed=seed, device=device, **kwargs)
    tokens, n = ops.verify_chain(torch.tensor([[draft]], device=device), None, logits, probs, params)
    return tokens[0].tolist(), int(n[0])


def test_zero_draft_probability_rejects(device):
    target = torch.zeros(4)  # p uniform
    q = torch.tensor([0.0, 0.5, 0.5, 0.0])  # the drafted token 0 has q = 0
    assert reference.uniforms(SEED_ACCEPT_U0_POS1, 0, 1, reference.STREAM_VERIFY)[0] == 0.0
    for seed in [SEED_ACCEPT_U0_POS1, 1, 2, 3]:
        tokens, n = one_step(device, target, q, 0, seed)
        assert n == 0 and tokens[0] in (0, 3)  # the residual max(0, p - q) lives on 0 and 3


def test_uniform_zero_and_near_one(device):
    """u = 0 accepts iff p(x) > 0 (a top-k-filtered draft is still rejected); u = 1 - 2^-24
    accepts when q(x) = p(x)."""
    assert reference.uniforms(SEED_ACCEPT_U_MAX_POS1, 0, 1, reference.STREAM_VERIFY)[0] == 1 - 2.0**-24
    target = torch.tensor([5.0, 0.0, -3.0, 1.0])
    assert one_step(device, target, None, 2, SEED_ACCEPT_U0_POS1)[1] == 1  # p(2) ~ 3e-4 > 0
    assert one_step(device, target, None, 2, SEED_ACCEPT_U0_POS1, top_k=2)[1] == 0  # p(2) = 0
    p = ops.sample_with_probs(target[None].to(device), SamplingParams.create(1, temperature=1.0, device=device))[1][0]
    for draft in range(4):
        assert one_step(device, target, p.cpu(), draft, SEED_ACCEPT_U_MAX_POS1)[1] == 1
    assert one_step(device, target, None, 1, SEED_ACCEPT_U_MAX_POS1)[1] == 0  # p(1) < u


def test_sampling_uniform_zero_and_near_one_pick_the_ends_of_the_kept_set(device):
    """The next token with u = 0 is the lowest-id token of positive probability, with
    u = 1 - 2^-24 the highest; filtered tokens at either end are never drawn. The same holds for
    a residual after a rejection."""
    assert reference.uniforms(SEED_SAMPLE_U0_POS0, 0, 0, reference.STREAM_VERIFY)[1] == 0.0
    assert reference.uniforms(SEED_SAMPLE_U_MAX_POS0, 0, 0, reference.STREAM_VERIFY)[1] == 1 - 2.0**-24
    logits = torch.tensor([[[-9.0, 2.0, 0.5, 3.0, 1.0, -8.0]]], device=device)
    empty = torch.zeros(1, 0, dtype=torch.int64, device=device)
    for seed, want in [(SEED_SAMPLE_U0_POS0, 1), (SEED_SAMPLE_U_MAX_POS0, 4)]:
        params = SamplingParams.create(1, temperature=1.0, top_k=4, seed=seed, device=device)
        assert ops.verify_chain(empty, None, logits, None, params)[0].item() == want
    # A rejected one-hot draft of token 1 leaves the residual on tokens 2, 3 and 4 (top-k 4).
    two_rows = torch.cat([logits, torch.zeros_like(logits)], 1)
    draft = torch.tensor([[1]], device=device)
    for seed, want in [(SEED_SAMPLE_U0_POS0, 2), (SEED_SAMPLE_U_MAX_POS0, 4)]:
        params = SamplingParams.create(1, temperature=1.0, top_k=4, seed=seed, device=device)
        assert reference.uniforms(seed, 0, 1, reference.STREAM_VERIFY)[0] > 0.5  # p(1) ~ 0.23: rejected
        tokens, n = ops.verify_chain(draft, None, two_rows, None, params)
        assert n.item() == 0 and tokens[0, 0].item() == want


def test_all_zero_residual_falls_back_to_p(device, gen):
    """q = 1.5 p everywhere: max(0, p - q) is all zero, acceptance is p/q = 2/3; after a
    rejection the next token must come from p (never an uninitialised id)."""
    vocab, batch = 8, 2000
    target = torch.randn(vocab, generator=gen)
    p = torch.softmax(target, 0)
    q = (1.5 * p).clamp_max(1.0)
    logits = torch.stack([target, target]).expand(batch, 2, vocab).contiguous().to(device)
    probs = q.expand(batch, 1, vocab).contiguous().to(device)
    drafts = torch.multinomial(p, batch, replacement=True, generator=gen)[:, None].to(device)
    params = SamplingParams.create(batch, temperature=1.0, seed=torch.arange(batch), device=device)
    tokens, n = ops.verify_chain(drafts, None, logits, probs, params)
    rejected = n == 0
    assert 0.25 < float(rejected.float().mean()) < 0.42  # 1/3 expected
    assert (tokens[rejected, 0] >= 0).all() and (tokens[rejected, 0] < vocab).all()
    assert_same((tokens, n), reference.verify_chain(drafts, None, logits, probs, params))


def test_vocab_of_one_and_no_drafts(device):
    params = SamplingParams.create(3, temperature=[0.0, 1.0, 0.5], seed=[1, 2, 3], device=device)
    tokens, n = ops.verify_chain(torch.zeros(3, 4, dtype=torch.int64, device=device), None, torch.randn(3, 5, 1, device=device), None, params)
    assert tokens.tolist() == [[0] * 5] * 3 and n.tolist() == [4] * 3
    empty = torch.zeros(3, 0, dtype=torch.int64, device=device)
    logits = torch.randn(3, 1, 50, device=device)
    tokens, n = ops.verify_chain(empty, None, logits, None, params)
    assert tokens.shape == (3, 1) and n.tolist() == [0, 0, 0]
    assert tokens[0, 0].item() == int(logits[0, 0].argmax())
    assert_same((tokens, n), reference.verify_chain(empty, None, logits, None, params))
    nodes, toks, n = ops.verify_tree(torch.zeros(3, 1, dtype=torch.int64, device=device), torch.full((3, 1), -1, device=device), logits, None, params)
    assert nodes.tolist() == [[-1]] * 3 and torch.equal(toks, tokens) and n.tolist() == [0, 0, 0]
    nothing = ops.verify_chain(torch.zeros(0, 3, dtype=torch.int64, device=device), None, torch.zeros(0, 4, 7, device=device), None, SamplingParams.create(0, device=device))
    assert nothing[0].shape == (0, 4) and nothing[1].shape == (0,)


def test_filters_that_are_off_change_nothing(device, gen):
    batch, k, vocab = 20, 3, 40
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, torch.float32, gen, device)
    plain = SamplingParams.create(batch, temperature=0.8, seed=torch.arange(batch), device=device)
    off = SamplingParams.create(batch, temperature=0.8, top_k=[vocab, 0, -1, 10**9] * 5, top_p=1.0, min_p=0.0, seed=torch.arange(batch), device=device)
    assert_same(ops.verify_chain(drafts, num_draft, logits, probs, off), ops.verify_chain(drafts, num_draft, logits, probs, plain))


def test_int32_inputs_are_accepted_by_the_wrappers(device, gen):
    drafts, num_draft, logits, probs = random_chain(5, 2, 30, torch.float32, gen, device)
    params = random_params(5, gen, device)
    want = ops.verify_chain(drafts, num_draft, logits, probs, params)
    assert_same(ops.verify_chain(drafts.int(), num_draft.int(), logits, probs, params), want)


# ----------------------------------------------------------------------------- typical


def typical_decision_by_hand(logits_row, temperature, eps, alpha, token):
    p = torch.softmax(logits_row.double() / temperature, 0)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum()
    return float(p[token]) > min(eps, alpha * math.exp(-float(entropy)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_typical_chain_and_tree_match_reference(device, gen, dtype):
    batch, k, vocab = 30, 4, 80
    drafts, num_draft, logits, _ = random_chain(batch, k, vocab, dtype, gen, device)
    params = random_params(batch, gen, device)
    offset = torch.arange(batch, device=device)
    for eps, alpha in [(0.09, 0.3), (0.3, 0.9), (0.01, 0.05)]:
        got = ops.typical_verify_chain(drafts, num_draft, logits, params, offset, eps, alpha)
        assert_same(got, reference.typical_verify_chain(drafts, num_draft, logits, params, offset, eps, alpha))
        check_chain_invariants(drafts.cpu(), num_draft.cpu(), *[t.cpu() for t in got])
    tokens, parents, tree_logits, _ = random_tree(batch, 12, vocab, dtype, gen, device)
    got = ops.typical_verify_tree(tokens, parents, tree_logits, params, offset)
    assert_same(got, reference.typical_verify_tree(tokens, parents, tree_logits, params, offset))


def test_typical_rule_by_hand(device, gen):
    """First-draft decisions against p(x) > min(eps, alpha * exp(-H(p))) computed in double."""
    batch, vocab = 200, 12
    logits = (2 * torch.randn(batch, 2, vocab, generator=gen))
    drafts = torch.randint(0, vocab, (batch, 1), generator=gen)
    temperature = 0.5 + torch.rand(batch, generator=gen)
    params = SamplingParams.create(batch, temperature=temperature, device=device)
    _, n = ops.typical_verify_chain(drafts.to(device), None, logits.to(device), params, None, 0.2, 0.5)
    want = [typical_decision_by_hand(logits[b, 0], float(temperature[b]), 0.2, 0.5, int(drafts[b, 0])) for b in range(batch)]
    assert n.cpu().bool().tolist() == want
    assert 0 < sum(want) < batch


def test_typical_greedy_rows_behave_as_greedy(device, gen):
    drafts, num_draft, logits, _ = random_chain(20, 3, 50, torch.float32, gen, device)
    params = SamplingParams.create(20, temperature=0.0, device=device)
    assert_same(
        ops.typical_verify_chain(drafts, num_draft, logits, params),
        ops.verify_chain(drafts, num_draft, logits, None, params),
    )


# ----------------------------------------------------------------------------- opcheck, compile


def verify_samples(device):
    gen = torch.Generator().manual_seed(3)
    drafts, num_draft, logits, probs = random_chain(4, 3, 33, torch.float16, gen, device)
    tokens, parents, tree_logits, tree_probs = random_tree(4, 6, 33, torch.float32, gen, device)
    p = random_params(4, gen, device).tensors()
    offset = torch.arange(4, device=device)
    return [
        (torch.ops.specdec.verify_chain.default, (drafts, num_draft, logits, probs, *p, offset)),
        (torch.ops.specdec.verify_chain.default, (drafts, num_draft, logits, None, *p, offset)),
        (torch.ops.specdec.verify_tree.default, (tokens, parents, tree_logits, tree_probs, *p, offset)),
        (torch.ops.specdec.typical_verify_chain.default, (drafts, num_draft, logits, *p, offset, 0.09, 0.3)),
        (torch.ops.specdec.typical_verify_tree.default, (tokens, parents, tree_logits, *p, offset, 0.09, 0.3)),
    ]


@pytest.mark.parametrize("which", range(5))
def test_opcheck(device, which):
    op, args = verify_samples(device)[which]
    torch.library.opcheck(op, args)


def test_torch_compile_fullgraph(device, gen):
    drafts, num_draft, logits, probs = random_chain(6, 3, 40, torch.float32, gen, device)
    tokens, parents, tree_logits, _ = random_tree(6, 5, 40, torch.float32, gen, device)
    params = random_params(6, gen, device)

    @torch.compile(fullgraph=True)
    def step(drafts, num_draft, logits, probs, tokens, parents, tree_logits, temperature, top_k, top_p, min_p, seed):
        p = SamplingParams(temperature, top_k, top_p, min_p, seed)
        chain = ops.verify_chain(drafts, num_draft, logits, probs, p)
        tree = ops.verify_tree(tokens, parents, tree_logits, None, p)
        typical = ops.typical_verify_chain(drafts, num_draft, logits, p)
        return chain[1] + tree[2] + typical[1], chain[0]

    total, chain_tokens = step(drafts, num_draft, logits, probs, tokens, parents, tree_logits, *params.tensors())
    want_chain = reference.verify_chain(drafts, num_draft, logits, probs, params)
    want_tree = reference.verify_tree(tokens, parents, tree_logits, None, params)
    want_typical = reference.typical_verify_chain(drafts, num_draft, logits, params)
    assert torch.equal(chain_tokens, want_chain[0])
    assert torch.equal(total, want_chain[1] + want_tree[2] + want_typical[1])


# ----------------------------------------------------------------------------- bad input


def chain_args(device, **overrides):
    args = dict(
        draft_tokens=torch.tensor([[1, 2], [3, 4], [0, 0]], device=device),
        num_draft=torch.tensor([2, 2, 1], device=device),
        target_logits=torch.randn(3, 3, 6, device=device),
        draft_probs=torch.full((3, 2, 6), 1 / 6, device=device),
        params=SamplingParams.create(3, temperature=[0.0, 1.0, 1.0], device=device),
    )
    args.update(overrides)
    return args


def test_chain_rejects_bad_values(device):
    bad_logits = torch.randn(3, 3, 6, device=device)
    bad_logits[2, 1, 3] = float("nan")  # row 1 of request 2 is used (num_draft = 1)
    inf_logits = torch.randn(3, 3, 6, device=device)
    inf_logits[1, 2, 0] = float("inf")
    bad_probs = torch.full((3, 2, 6), 1 / 6, device=device)
    bad_probs[1, 1, 4] = float("nan")
    bad_probs_first = torch.full((3, 2, 6), 1 / 6, device=device)
    bad_probs_first[1, 0, 3] = 1.5  # at draft_tokens[1, 0] = 3
    cases = [
        (dict(draft_tokens=torch.tensor([[1, 2], [3, 6], [0, 0]], device=device)), r"request 1: draft_tokens\[1, 1\] = 6 is out of range for vocabulary size 6"),
        (dict(draft_tokens=torch.tensor([[1, 2], [3, 4], [-1, 0]], device=device)), r"request 2: draft_tokens\[2, 0\] = -1"),
        (dict(num_draft=torch.tensor([2, 3, 1], device=device)), r"request 1: num_draft\[1\] = 3 must be in \[0, K = 2\]"),
        (dict(num_draft=torch.tensor([-1, 2, 1], device=device)), r"request 0: num_draft\[0\] = -1"),
        (dict(target_logits=bad_logits), r"request 2: target_logits\[2, 1\] contains NaN"),
        (dict(target_logits=inf_logits), r"request 1: target_logits\[1, 2\] contains NaN or \+Inf"),
        (dict(draft_probs=bad_probs), r"request 1: draft_probs\[1, 1, 4\] = nan"),
        (dict(params=SamplingParams.create(3, temperature=[0.0, -1.0, 1.0], device=device)), r"request 1: temperature\[1\] = -1"),
        # Several bad drafts in one request: the smallest error code (a bad token before a
        # bad probability), on CPU as on CUDA, not the first position.
        (dict(draft_tokens=torch.tensor([[1, 2], [3, 6], [0, 0]], device=device), draft_probs=bad_probs_first), r"request 1: draft_tokens\[1, 1\] = 6"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            ops.verify_chain(**chain_args(device, **overrides))


def test_chain_rejects_bad_shapes(device):
    good = chain_args(device)
    cases = [
        (dict(target_logits=torch.randn(3, 2, 6, device=device)), r"target_logits must have shape \[B, K\+1, V\] = \[3, 3, V\]"),
        (dict(target_logits=torch.randn(3, 3, 6, device=device).double()), "float32, float16 or bfloat16"),
        (dict(draft_probs=torch.full((3, 2, 5), 0.2, device=device)), r"draft_probs must have shape \[3, 2, 6\]"),
        (dict(draft_probs=torch.full((3, 2, 6), 0.2, device=device).half()), "draft_probs must have dtype Float"),
        (dict(num_draft=torch.tensor([1, 1], device=device)), "num_draft must have shape"),
        (dict(params=SamplingParams.create(2, device=device)), "temperature must have shape"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            ops.verify_chain(**{**good, **overrides})


def tree_call(device, parents, tokens=None, vocab=5):
    parents = torch.tensor([parents], device=device)
    tokens = torch.ones_like(parents) if tokens is None else torch.tensor([tokens], device=device)
    logits = torch.randn(1, parents.shape[1], vocab, device=device)
    return ops.verify_tree(tokens, parents, logits, None, SamplingParams.create(1, temperature=1.0, device=device))


@pytest.mark.parametrize(
    "parents, message",
    [
        ([0, 0, 1], r"parents\[0, 0\] = 0: node 0 must be the root"),
        ([-1, 0, -1], r"parents\[0, 2\] = -1: more than one root"),
        ([-1, 2, 0], r"parents\[0, 1\] = 2: a parent must come before its child"),
        ([-1, 1, 0], r"parents\[0, 1\] = 1: a parent must come before"),  # self loop
        ([-1, 2, 1], r"parents\[0, 1\] = 2"),  # a cycle 1 -> 2 -> 1
        ([-1, -2, 1], r"parents\[0, 2\] = 1 points to a padding node"),
        ([-1, 0, -3], r"parents\[0, 2\] = -3"),
    ],
)
def test_tree_rejects_malformed_trees(device, parents, message):
    with pytest.raises(ValueError, match="request 0: " + message):
        tree_call(device, parents)


def test_tree_rejects_bad_tokens_but_ignores_padding_and_root(device):
    with pytest.raises(ValueError, match=r"tree_tokens\[0, 2\] = 5 is out of range"):
        tree_call(device, [-1, 0, 1], tokens=[0, 1, 5])
    nodes, tokens, n = tree_call(device, [-1, 0, -2], tokens=[-9, 1, 99])  # root and padding unread
    assert int(tokens[0, int(n[0])]) in range(5)


# ----------------------------------------------------------------------------- CUDA graphs


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_cuda_graph_capture_and_errors_under_capture():
    """The ops capture into a CUDA graph (no host synchronisation); under capture a request with
    NaN logits cannot raise, and gets num_accepted 0 and tokens -1 instead."""
    gen = torch.Generator().manual_seed(11)
    drafts, num_draft, logits, probs = random_chain(8, 4, 1000, torch.bfloat16, gen, "cuda")
    params = random_params(8, gen, "cuda")
    offset = torch.arange(8, device="cuda")
    want = ops.verify_chain(drafts, num_draft, logits, probs, params, offset)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up outside capture
        ops.verify_chain(drafts, num_draft, logits, probs, params, offset)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = ops.verify_chain(drafts, num_draft, logits, probs, params, offset)
    graph.replay()
    torch.cuda.synchronize()
    assert_same(got, want)
    logits[3, 0, 5] = float("nan")  # row 0 is always used
    graph.replay()
    torch.cuda.synchronize()
    assert got[1][3].item() == 0 and (got[0][3] == -1).all()
    keep = torch.arange(8, device="cuda") != 3
    assert torch.equal(got[0][keep], want[0][keep]) and torch.equal(got[1][keep], want[1][keep])
