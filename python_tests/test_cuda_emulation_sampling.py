"""The CUDA kernels of the sampling and verification ops (csrc/cuda/kernels/sampling_kernels.cuh:
row teams, radix select, warp shuffles, shared atomics, Philox), run by the emulator
(python_tests/emulation.py) with the launch their launcher derives for an H100 (clusters of up
to 8 blocks, row slices in shared memory), and for some cases an A100 (a block per row) or a
device whose shared memory holds no row slice (later passes re-read global memory), over the
cases of test_sampling.py, test_sampling_paths.py and test_verify.py: tokens and decisions equal
to the reference's and the CPU kernel's, probabilities as close as those tests ask of CUDA, the
CPU kernel's error for every bad input. Cases alternate between the emulator's two schedules.

The statistical tests (10^6 draws) are left to the GPU check: the emulator runs ~10^5 times
slower than the device."""

import re

import pytest
import torch

from python_tests import emulation
from python_tests.conftest import FLOAT_DTYPES
from python_tests.sampling_cases import (
    SEED_ACCEPT_U0_POS1,
    SEED_ACCEPT_U_MAX_POS1,
    SEED_SAMPLE_U0_POS0,
    SEED_SAMPLE_U_MAX,
    SEED_SAMPLE_U_MAX_POS0,
    random_chain,
    random_logits,
    random_params,
    random_tree,
)
from python_tests.test_sampling import VOCABS
from python_tests.test_sampling_paths import PATH_VOCABS, PATHS, path_params
from python_tests.test_verify import (
    CHAIN_VOCABS,
    GREEDY_CHAIN_K,
    GREEDY_TREE_NODES,
    TREE_NODES,
    chain_as_tree,
    check_chain_invariants,
    greedy_chain_by_hand,
    greedy_tree_by_hand,
)
from specdec_kernels import ops, reference
from specdec_kernels.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    emulation.library() is None, reason=emulation.UNAVAILABLE or "emulator unavailable"
)

# A device with room for no row slice in shared memory (sm_90, 48 KiB per block).
NO_SLICE = (132, 9, 98304, 49152)
NO_ERROR = -1


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w), f"\n{g}\n!=\n{w}"


def sample(logits, params, offset=None, **kwargs):
    """Emulated sample_with_probs, checked against the reference and the CPU kernel: the same
    tokens; probabilities within the tolerance test_sampling gives CUDA, and equal to the CPU
    kernel's bit for bit (both sum the kept mass in double: the float32 rounding of two double
    sums in different orders differs with probability ~2^-29 per row)."""
    tokens, probs, errors, team = emulation.sample_with_probs(logits, params, offset, **kwargs)
    assert (errors == NO_ERROR).all(), errors
    want_tokens, want_probs = reference.sample_with_probs(logits, params, offset)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-7)
    cpu_tokens, cpu_probs = ops.sample_with_probs(logits, params, offset)
    assert torch.equal(tokens, cpu_tokens) and torch.equal(probs, cpu_probs)
    return tokens, probs, team


# ----------------------------------------------------------------------------- sample


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_sample_matches_reference(gen, dtype, vocab):
    rows = 48
    logits = random_logits((rows, vocab), dtype, gen)
    params = random_params(rows, gen)
    offset = torch.randint(0, 10**6, (rows,), generator=gen)
    sample(logits, params, offset, adversarial=vocab % 2 == 1)


@pytest.mark.parametrize("device,adversarial", [(emulation.H100, True), (emulation.A100, False),
                                                (NO_SLICE, True)])
def test_sample_team_plans(gen, device, adversarial):
    """The plans the launcher makes on other devices: one block per row before sm_90, rows
    re-read from global memory where shared memory holds no slice."""
    names = list(PATHS) * 2
    logits = (3.0 * torch.randn(len(names), 30000, generator=gen)).bfloat16()
    _, _, team = sample(logits, path_params(names, "cpu"), torch.arange(len(names)),
                        device=device, adversarial=adversarial)
    assert team.size == {emulation.H100: 4, emulation.A100: 1, NO_SLICE: 8}[device]
    assert (team.cache_bytes == 0) == (device == NO_SLICE)
    assert team.table and team.vec == 8


def test_sample_semantics_and_edge_cases():
    """test_sampling's hand-checked cases: ties to the lowest id, top-k ties, top-p's smallest
    prefix, vocabulary of one, -inf, a uniform of 1 - 2^-24 drawing the last kept token."""
    ties = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0],
                         [-float("inf"), -float("inf"), 0.5, 0.5], [0.0, -0.0, -1.0, -2.0]])
    for dtype in FLOAT_DTYPES:
        tokens, _, _ = sample(ties.to(dtype), SamplingParams.create(4))
        assert tokens.tolist() == [1, 0, 2, 0]
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, -1.0]]).expand(4, 6).contiguous()
    _, probs, _ = sample(logits, SamplingParams.create(4, temperature=1.0, top_k=[1, 3, 0, 6]))
    assert (probs > 0).tolist() == [[False, True, False, True, False, False],
                                    [False, True, True, True, True, False]] + [[True] * 6] * 2
    halves = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25]])).expand(4, 4).contiguous()
    _, probs, _ = sample(halves, SamplingParams.create(4, temperature=1.0,
                                                       top_p=[0.4, 0.5, 0.6, 0.8]))
    assert (probs > 0).tolist() == [[False, True, False, False]] * 2 + [
        [False, True, False, True], [True] * 4]
    tokens, probs, _ = sample(torch.randn(3, 1), SamplingParams.create(
        3, temperature=[0.0, 1.0, 2.0], top_k=[0, 1, 5], top_p=[1.0, 0.5, 0.1]))
    assert tokens.tolist() == [0, 0, 0] and probs.tolist() == [[1.0]] * 3
    inf = torch.full((50, 5), -float("inf"))
    inf[:, 3], inf[:, 1] = 0.0, 0.5
    tokens, probs, _ = sample(inf, SamplingParams.create(50, temperature=1.0, seed=torch.arange(50)))
    assert set(tokens.tolist()) == {1, 3} and (probs[:, [0, 2, 4]] == 0).all()
    last = torch.tensor([[3.0, 0.0, 2.0, 1.0, -5.0]]).expand(3, 5).contiguous()
    tokens, _, _ = sample(last, SamplingParams.create(3, temperature=1.0, top_k=[0, 3, 1],
                                                      seed=SEED_SAMPLE_U_MAX))
    assert tokens.tolist() == [4, 3, 0]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("vocab", PATH_VOCABS)
def test_every_path_matches_reference(gen, dtype, vocab):
    names = list(PATHS) * 3
    logits = (3.0 * torch.randn(len(names), vocab, generator=gen)).to(dtype)
    offset = torch.randint(0, 2**40, (len(names),), generator=gen)
    sample(logits, path_params(names, "cpu"), offset, adversarial=dtype == torch.float16)


def test_bf16_weight_table_window(gen):
    """test_sampling_paths' rows of logits inside the bf16 table's window and outside it."""
    rows, vocab = 16, 20000
    logits = 3.0 * torch.randn(rows, vocab, generator=gen)
    logits[:, ::97] = 300.0 * torch.rand(rows, logits[:, ::97].shape[1], generator=gen) - 400.0
    logits[:, 1::89] = 1e-3 * torch.randn(rows, logits[:, 1::89].shape[1], generator=gen)
    logits[:, 2::83] = 0.0
    logits[:, 3::79] = -float("inf")
    logits[::2, 5] = 280.0
    names = (list(PATHS) * 2)[:rows]
    _, _, team = sample(logits.bfloat16(), path_params(names, "cpu"), torch.arange(rows),
                        adversarial=True)
    assert team.table and team.size > 1


def test_top_p_radix_with_ties_and_a_huge_nucleus(gen):
    logits = torch.randint(-3, 3, (6, 3000), generator=gen).float()
    params = SamplingParams.create(6, temperature=2.0, top_p=[0.3, 0.6, 0.9, 0.99, 0.5, 0.75],
                                   top_k=[0, 0, 0, 0, 2000, 10])
    sample(logits, params, torch.arange(6))


def test_flat_rows_draw_floor_u_times_v_across_blocks():
    """Flat rows of 2^17 tokens over clusters of 8 blocks: the draw is floor(u * V), so every
    segment and block boundary of the inverse CDF is crossed."""
    rows, vocab = 24, 2**17
    seeds = torch.arange(rows) * 104729 + 3
    expected = [int(reference.uniforms(int(s), 0, 0, reference.STREAM_SAMPLE)[1] * vocab)
                for s in seeds]
    for dtype in FLOAT_DTYPES:
        params = SamplingParams.create(rows, temperature=1.0, seed=seeds)
        tokens, errors, team = emulation.sample(torch.zeros(rows, vocab, dtype=dtype), params,
                                                adversarial=dtype == torch.float16)
        assert tokens.tolist() == expected and (errors == NO_ERROR).all(), dtype
        assert team.size == 8


def seeds_with_integer_target(tokens, count):
    """Seeds whose ops.sample uniform u (offset 0) makes u * tokens an integer: on a flat row of
    `tokens` kept tokens (a power of two) the draw's target then equals a cumulative weight."""
    found, seed = [], 0
    while len(found) < count:
        u = reference.uniforms(seed, 0, 0, reference.STREAM_SAMPLE)[1]
        if (u * tokens).is_integer():
            found.append(seed)
        seed += 1
    return found


def test_draws_whose_target_is_a_cumulative_weight():
    """A target u * total exactly equal to a cumulative weight draws the first token whose
    cumulative weight exceeds it (core/verify.h's rule), not the one that reaches it: on the
    segments of flat rows and on a top-k kept list of equal weights."""
    vocab = 2**17
    seeds = seeds_with_integer_target(vocab, 4)
    tokens, _, _ = sample(torch.zeros(4, vocab),
                          SamplingParams.create(4, temperature=1.0, seed=seeds))
    assert tokens.tolist() == [int(reference.uniforms(s, 0, 0, reference.STREAM_SAMPLE)[1] * vocab)
                               for s in seeds]
    kept = torch.arange(0, 1000, 15)[:64]
    logits = torch.full((4, 1000), -float("inf"))
    logits[:, kept] = 0.0
    seeds = seeds_with_integer_target(64, 4)
    tokens, _, _ = sample(logits, SamplingParams.create(4, temperature=1.0, top_k=64, seed=seeds))
    assert tokens.tolist() == [
        int(kept[int(reference.uniforms(s, 0, 0, reference.STREAM_SAMPLE)[1] * 64)]) for s in seeds]


def test_kernel_uniforms_match_reference_bits():
    """test_sampling's Philox check on flat rows of 2^12 tokens: seeds and offsets of every
    sign and size give the reference's uniforms, 12 bits at a time."""
    n, vocab = 200, 4096
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=torch.Generator().manual_seed(5))
    offsets = torch.randint(0, 2**40, (n,), generator=torch.Generator().manual_seed(6))
    params = SamplingParams.create(n, temperature=1.0, seed=seeds)
    tokens, _, _ = emulation.sample(torch.zeros(n, vocab), params, offsets)
    expected = [int(reference.uniforms(int(s), int(o), 0, reference.STREAM_SAMPLE)[1] * vocab)
                for s, o in zip(seeds, offsets)]
    assert tokens.tolist() == expected


# ----------------------------------------------------------------------------- verify


def verify_chain(drafts, num_draft, logits, probs, params, offset=None, **kwargs):
    """Emulated verify_chain, checked against the reference and the CPU kernel."""
    got, errors, team = emulation.verify_chain(drafts, num_draft, logits, probs, params, offset,
                                               **kwargs)
    assert (errors == NO_ERROR).all(), errors
    assert_same(got, reference.verify_chain(drafts, num_draft, logits, probs, params, offset))
    assert_same(got, ops.verify_chain(drafts, num_draft, logits, probs, params, offset))
    return got


def verify_tree(tokens, parents, logits, probs, params, offset=None, **kwargs):
    got, errors, team = emulation.verify_tree(tokens, parents, logits, probs, params, offset,
                                              **kwargs)
    assert (errors == NO_ERROR).all(), errors
    assert_same(got, reference.verify_tree(tokens, parents, logits, probs, params, offset))
    assert_same(got, ops.verify_tree(tokens, parents, logits, probs, params, offset))
    return got


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", GREEDY_CHAIN_K)
def test_greedy_chain_exact(gen, dtype, k):
    drafts, num_draft, logits, probs = random_chain(33, k, 97, dtype, gen)
    params = SamplingParams.create(33, temperature=0.0, top_k=5, top_p=0.5)
    got = verify_chain(drafts, num_draft, logits, probs, params, adversarial=k == 1)
    assert_same(got, greedy_chain_by_hand(drafts, num_draft, logits))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_nodes", GREEDY_TREE_NODES)
def test_greedy_tree_exact(gen, dtype, num_nodes):
    tokens, parents, logits, probs = random_tree(21, num_nodes, 61, dtype, gen)
    params = SamplingParams.create(21, temperature=0.0)
    got = verify_tree(tokens, parents, logits, probs, params, adversarial=num_nodes % 2 == 1)
    assert_same(got, greedy_tree_by_hand(tokens, parents, logits))


def test_greedy_tree_takes_the_longest_path():
    parents = torch.tensor([[-1, 0, 0, 2, 3]])
    tokens = torch.tensor([[0, 4, 4, 1, 2]])
    logits = torch.zeros(1, 5, 6)
    logits[0, 0, 4] = logits[0, 2, 1] = logits[0, 3, 2] = logits[0, 4, 5] = logits[0, 1, 0] = 3.0
    nodes, toks, n = verify_tree(tokens, parents, logits, None, SamplingParams.create(1))
    assert nodes.tolist() == [[2, 3, 4, -1, -1]] and toks.tolist() == [[4, 1, 2, 5, -1]]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("vocab", CHAIN_VOCABS)
def test_chain_matches_reference(gen, dtype, with_probs, vocab):
    batch, k = 40, 4
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, dtype, gen,
                                                    with_probs=with_probs)
    params = random_params(batch, gen)
    offset = torch.randint(0, 2**40, (batch,), generator=gen)
    tokens, n = verify_chain(drafts, num_draft, logits, probs, params, offset,
                             adversarial=with_probs)
    _, tree_tokens, tree_n = verify_tree(*chain_as_tree(drafts, num_draft, logits, probs), params,
                                         offset, adversarial=not with_probs)
    assert torch.equal(tree_tokens[:, : k + 1], tokens) and torch.equal(tree_n, n)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("num_nodes", TREE_NODES)
def test_tree_matches_reference(gen, dtype, with_probs, num_nodes):
    batch = 30
    tokens, parents, logits, probs = random_tree(batch, num_nodes, 211, dtype, gen,
                                                 with_probs=with_probs)
    params = random_params(batch, gen)
    offset = torch.randint(0, 2**40, (batch,), generator=gen)
    verify_tree(tokens, parents, logits, probs, params, offset, adversarial=with_probs)


def test_wide_tree_with_many_rejections(gen):
    batch, vocab = 16, 40
    parents = torch.tensor([-1] + [0] * 10 + [1] * 10).repeat(batch, 1)
    tokens = torch.randint(0, vocab, parents.shape, generator=gen)
    logits = random_logits((batch, 21, vocab), torch.float32, gen)
    probs = torch.softmax(0.3 * torch.randn(batch, 21, vocab, generator=gen), -1)
    params = random_params(batch, gen, greedy_fraction=0.0)
    for q in [None, probs]:
        verify_tree(tokens, parents, logits, q, params, adversarial=q is None)


def test_chain_invariants_ragged_rows_and_poisoned_padding(gen):
    """Rows and drafts past num_draft are never read (NaN, -7), and a request's result does not
    depend on the rest of the batch."""
    batch, k, vocab = 64, 6, 300
    drafts, num_draft, logits, probs = random_chain(batch, k, vocab, torch.float32, gen)
    params = random_params(batch, gen)
    tokens, n = verify_chain(drafts, num_draft, logits, probs, params)
    check_chain_invariants(drafts, num_draft, tokens, n)
    assert 0 < int(n.sum()) < int(num_draft.sum())
    poisoned = logits.clone(), drafts.clone(), probs.clone()
    for b in range(batch):
        m = int(num_draft[b])
        poisoned[0][b, m + 1:] = float("nan")
        poisoned[1][b, m:] = -7
        poisoned[2][b, m:] = float("nan")
    again, errors, _ = emulation.verify_chain(poisoned[1], num_draft, poisoned[0], poisoned[2],
                                              params, adversarial=True)
    assert (errors == NO_ERROR).all() and torch.equal(again[0], tokens) and torch.equal(again[1], n)
    perm = torch.randperm(batch, generator=gen)
    permuted, _, _ = emulation.verify_chain(drafts[perm], num_draft[perm], logits[perm],
                                            probs[perm], params.select(perm))
    assert torch.equal(permuted[0], tokens[perm]) and torch.equal(permuted[1], n[perm])


def test_long_rows_few_requests(gen):
    """test_sampling_paths' B = 2 with a Llama-3 vocabulary: each row spread over a cluster of
    8 blocks; rejections with draft probabilities sum and draw residuals over the split row."""
    vocab = 128256
    drafts, num_draft, logits, probs = random_chain(2, 3, vocab, torch.bfloat16, gen,
                                                    accept_bias=0.3)
    for name, q in [("no filter", probs), ("top-k list, top-p, min-p", None),
                    ("top-p preselected", probs), ("top-p wide (radix masses)", None)]:
        verify_chain(drafts, num_draft, logits, q, path_params([name, name], "cpu"),
                     torch.tensor([5, 17]), adversarial=q is None)
    verify_chain(drafts, num_draft, logits, None, SamplingParams.create(2))


def test_mixed_greedy_and_sampling_rows_share_a_batch(gen):
    drafts, num_draft, logits, probs = random_chain(12, 3, 64, torch.float16, gen)
    params = SamplingParams.create(12, temperature=[0.0, 1.0] * 6, top_k=[0, 10] * 6,
                                   seed=torch.arange(12))
    verify_chain(drafts, num_draft, logits, probs, params)


def one_step(target_row, q_row, draft, seed, **kwargs):
    logits = torch.stack([target_row, torch.zeros_like(target_row)])[None]
    probs = None if q_row is None else q_row[None, None]
    params = SamplingParams.create(1, temperature=1.0, seed=seed, **kwargs)
    tokens, n = verify_chain(torch.tensor([[draft]]), None, logits, probs, params)
    return tokens[0].tolist(), int(n[0])


def test_edge_cases_of_design_section_3(gen):
    """Draft probability 0 rejects; u = 0 accepts iff p > 0 and u = 1 - 2^-24 accepts q = p;
    sampling uniforms 0 and 1 - 2^-24 draw the ends of the kept set (also from a residual); an
    all-zero residual falls back to p; vocabulary of one; K = 0."""
    q = torch.tensor([0.0, 0.5, 0.5, 0.0])
    for seed in [SEED_ACCEPT_U0_POS1, 1, 2]:
        tokens, n = one_step(torch.zeros(4), q, 0, seed)
        assert n == 0 and tokens[0] in (0, 3)
    target = torch.tensor([5.0, 0.0, -3.0, 1.0])
    assert one_step(target, None, 2, SEED_ACCEPT_U0_POS1)[1] == 1
    assert one_step(target, None, 2, SEED_ACCEPT_U0_POS1, top_k=2)[1] == 0
    p = torch.softmax(target, 0)
    assert one_step(target, p, 3, SEED_ACCEPT_U_MAX_POS1)[1] == 1
    assert one_step(target, None, 1, SEED_ACCEPT_U_MAX_POS1)[1] == 0
    logits = torch.tensor([[[-9.0, 2.0, 0.5, 3.0, 1.0, -8.0]]])
    empty = torch.zeros(1, 0, dtype=torch.int64)
    two_rows = torch.cat([logits, torch.zeros_like(logits)], 1)
    for seed, first, residual in [(SEED_SAMPLE_U0_POS0, 1, 2), (SEED_SAMPLE_U_MAX_POS0, 4, 4)]:
        params = SamplingParams.create(1, temperature=1.0, top_k=4, seed=seed)
        assert verify_chain(empty, None, logits, None, params)[0].item() == first
        tokens, n = verify_chain(torch.tensor([[1]]), None, two_rows, None, params)
        assert n.item() == 0 and tokens[0, 0].item() == residual
    vocab, batch = 8, 300
    target = torch.randn(vocab, generator=gen)
    p = torch.softmax(target, 0)
    logits = torch.stack([target, target]).expand(batch, 2, vocab).contiguous()
    probs = (1.5 * p).clamp_max(1.0).expand(batch, 1, vocab).contiguous()
    drafts = torch.multinomial(p, batch, replacement=True, generator=gen)[:, None]
    params = SamplingParams.create(batch, temperature=1.0, seed=torch.arange(batch))
    tokens, n = verify_chain(drafts, None, logits, probs, params, adversarial=True)
    assert 0 < int((n == 0).sum()) < batch
    params = SamplingParams.create(3, temperature=[0.0, 1.0, 0.5], seed=[1, 2, 3])
    tokens, n = verify_chain(torch.zeros(3, 4, dtype=torch.int64), None, torch.randn(3, 5, 1),
                             None, params)
    assert tokens.tolist() == [[0] * 5] * 3 and n.tolist() == [4] * 3
    verify_chain(empty.expand(3, 0), None, torch.randn(3, 1, 50), None, params)
    verify_tree(torch.zeros(3, 1, dtype=torch.int64), torch.full((3, 1), -1),
                torch.randn(3, 1, 50), None, params)


def test_filters_that_are_off_change_nothing(gen):
    drafts, num_draft, logits, probs = random_chain(20, 3, 40, torch.float32, gen)
    plain = SamplingParams.create(20, temperature=0.8, seed=torch.arange(20))
    off = SamplingParams.create(20, temperature=0.8, top_k=[40, 0, -1, 10**9] * 5, top_p=1.0,
                                min_p=0.0, seed=torch.arange(20))
    assert_same(verify_chain(drafts, num_draft, logits, probs, off),
                verify_chain(drafts, num_draft, logits, probs, plain))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_typical_chain_and_tree_match_reference(gen, dtype):
    batch, k, vocab = 30, 4, 80
    drafts, num_draft, logits, _ = random_chain(batch, k, vocab, dtype, gen)
    params = random_params(batch, gen)
    offset = torch.arange(batch)
    for eps, alpha in [(0.09, 0.3), (0.3, 0.9), (0.01, 0.05)]:
        got, errors, _ = emulation.typical_verify_chain(drafts, num_draft, logits, params, offset,
                                                        eps, alpha, adversarial=eps > 0.1)
        assert (errors == NO_ERROR).all()
        assert_same(got, reference.typical_verify_chain(drafts, num_draft, logits, params, offset,
                                                        eps, alpha))
        assert_same(got, ops.typical_verify_chain(drafts, num_draft, logits, params, offset, eps,
                                                  alpha))
    tokens, parents, tree_logits, _ = random_tree(batch, 12, vocab, dtype, gen)
    got, errors, _ = emulation.typical_verify_tree(tokens, parents, tree_logits, params, offset)
    assert (errors == NO_ERROR).all()
    assert_same(got, reference.typical_verify_tree(tokens, parents, tree_logits, params, offset))


# ----------------------------------------------------------------------------- bad input

# The CPU kernel's message for each error kind of core/sampling.h (ErrorKind).
ERROR_MESSAGES = {
    1: r"temperature\[", 2: r"top_p\[", 3: r"min_p\[", 4: r"num_draft\[", 5: "must be the root",
    6: "more than one root", 7: "must come before its child", 8: "points to a padding node",
    9: "is out of range", 10: r"draft_probs\[", 11: r"contains NaN or \+Inf",
}


def assert_cpu_reports(errors, call):
    """The emulated kernel's error codes name the request and the kind of error the CPU
    kernel's ValueError names: the first request with an error, and its code's kind and index."""
    bad = [b for b, code in enumerate(errors.tolist()) if code != NO_ERROR]
    assert bad, "the emulated kernel found no error"
    code = errors[bad[0]].item() & (2**64 - 1)
    kind, index = code >> 32, code & 0xFFFFFFFF
    with pytest.raises(ValueError) as raised:
        call()
    message = str(raised.value)
    assert message.startswith(f"request {bad[0]}: "), message
    assert re.search(ERROR_MESSAGES[kind], message), (kind, message)
    if kind in (6, 7, 8, 9, 10):
        assert f", {index}]" in message or f", {index}," in message, (index, message)


def test_sample_reports_the_cpu_kernels_errors():
    params = SamplingParams.create(3, temperature=[0.0, 1.0, 1.0])
    for bad, row in [(float("nan"), 1), (float("inf"), 2), (float("nan"), 0)]:
        logits = torch.randn(3, 10)
        logits[row, 4] = bad
        _, probs, errors, _ = emulation.sample_with_probs(logits, params)
        assert (probs[row] == 0).all()
        assert_cpu_reports(errors, lambda: ops.sample(logits, params))
    for field, value in [("temperature", -0.5), ("temperature", 1e-45), ("top_p", 0.0),
                         ("min_p", 1.0)]:
        params = SamplingParams.create(2, temperature=1.0)
        getattr(params, field)[1] = value
        logits = torch.randn(2, 5)
        tokens, _, errors, _ = emulation.sample_with_probs(logits, params)
        assert tokens[1] == -1 and tokens[0] >= 0
        assert_cpu_reports(errors, lambda: ops.sample(logits, params))


def test_chain_reports_the_cpu_kernels_errors():
    def args(**overrides):
        a = dict(draft_tokens=torch.tensor([[1, 2], [3, 4], [0, 0]]),
                 num_draft=torch.tensor([2, 2, 1]), target_logits=torch.randn(3, 3, 6),
                 draft_probs=torch.full((3, 2, 6), 1 / 6),
                 params=SamplingParams.create(3, temperature=[0.0, 1.0, 1.0]))
        a.update(overrides)
        return a
    nan_logits = torch.randn(3, 3, 6)
    nan_logits[2, 1, 3] = float("nan")
    bad_probs = torch.full((3, 2, 6), 1 / 6)
    bad_probs[1, 1, 4] = float("nan")
    first_prob = torch.full((3, 2, 6), 1 / 6)
    first_prob[1, 0, 3] = 1.5
    cases = [
        dict(draft_tokens=torch.tensor([[1, 2], [3, 6], [0, 0]])),
        dict(draft_tokens=torch.tensor([[1, 2], [3, 4], [-1, 0]])),
        dict(num_draft=torch.tensor([2, 3, 1])),
        dict(num_draft=torch.tensor([-1, 2, 1])),
        dict(target_logits=nan_logits),
        dict(draft_probs=bad_probs),
        dict(draft_probs=first_prob),
        dict(draft_tokens=torch.tensor([[1, 2], [3, 6], [0, 0]]), draft_probs=first_prob),
        dict(params=SamplingParams.create(3, temperature=[0.0, -1.0, 1.0])),
        # Drafts whose row reads would land just outside the logits (before the first row, past
        # the last): a node's team checks its children's tokens before reading at them.
        dict(draft_tokens=torch.tensor([[-5, 2], [3, 4], [0, 12]]), num_draft=torch.tensor([2, 2, 2]),
             params=SamplingParams.create(3, temperature=1.0)),
    ]
    for overrides in cases:
        a = args(**overrides)
        (tokens, n), errors, _ = emulation.verify_chain(
            a["draft_tokens"], a["num_draft"], a["target_logits"], a["draft_probs"], a["params"])
        bad = errors != NO_ERROR
        assert (n[bad] == 0).all() and (tokens[bad] == -1).all()
        assert_cpu_reports(errors, lambda: ops.verify_chain(**a))


@pytest.mark.parametrize("parents", [[0, 0, 1], [-1, 0, -1], [-1, 2, 0], [-1, 1, 0], [-1, 2, 1],
                                     [-1, -2, 1], [-1, 0, -3]])
def test_tree_reports_the_cpu_kernels_errors(parents):
    parents = torch.tensor([parents, [-1, 0, 0]])
    tokens = torch.ones_like(parents)
    logits = torch.randn(2, 3, 5)
    params = SamplingParams.create(2, temperature=1.0)
    (nodes, toks, n), errors, _ = emulation.verify_tree(tokens, parents, logits, None, params)
    assert errors[1] == NO_ERROR and n[0] == 0 and (toks[0] == -1).all() and (nodes[0] == -1).all()
    assert_cpu_reports(errors, lambda: ops.verify_tree(tokens, parents, logits, None, params))


def test_tree_ignores_padding_and_root_tokens_but_not_bad_ones():
    logits = torch.randn(1, 3, 5)
    params = SamplingParams.create(1, temperature=1.0)
    _, errors, _ = emulation.verify_tree(torch.tensor([[0, 1, 5]]), torch.tensor([[-1, 0, 1]]),
                                         logits, None, params)
    assert_cpu_reports(errors, lambda: ops.verify_tree(torch.tensor([[0, 1, 5]]),
                                                       torch.tensor([[-1, 0, 1]]), logits, None,
                                                       params))
    verify_tree(torch.tensor([[-9, 1, 99]]), torch.tensor([[-1, 0, -2]]), logits, None, params)
