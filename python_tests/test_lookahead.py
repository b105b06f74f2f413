"""Lookahead blocks: the window-mask op (vs its reference and a brute-force comb tree), the
engine's doorway for rows that are run but never verified (their logits, and the verified
rows' logits, against plain sequence forwards on both attention paths), the n-gram pool and
the drafters' parameters."""

import pytest
import torch

from python_tests.conftest import DEVICES, INDEX_DTYPES
from python_tests.decoding_helpers import hf_greedy, tiny_model
from specdec_kernels import ops, reference
from specdec_kernels.decoding import (
    Engine,
    ExtraRows,
    JacobiDrafter,
    LookaheadDrafter,
    StopCriteria,
    generate,
)
from specdec_kernels.decoding.lookahead import NgramPool
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.sampling import SamplingParams
from specdec_kernels.tree import PAD_PARENT, pack_tree_mask, stack_trees, tree_from_parents

# ----------------------------------------------------------------------------- the op


def comb_parents(window: int, levels: int, tree_parents: list, num_rows: int) -> list:
    """Brute force: a lookahead window is a comb hanging from the root. Cell (0, i) extends
    (0, i - 1), cell (l, i) extends (l - 1, i); padding rows are -2. Parents over the whole
    block (tree nodes, then window rows), for build_tree_masks."""
    nodes = len(tree_parents)

    def column(level, i):
        return 0 if level == i == 0 else nodes + level * window + i - 1

    parents = list(tree_parents) + [PAD_PARENT] * num_rows
    for level in range(levels):
        for i in range(window):
            if level == i == 0:
                continue
            parent = column(0, i - 1) if level == 0 else column(level - 1, i)
            parents[column(level, i)] = parent
    return parents


def assert_lookahead_masks_equal(got, want):
    for name, a, b in zip(got._fields, got, want):
        assert a.dtype == b.dtype, name
        assert torch.equal(a.cpu(), b.cpu()), name


def test_lookahead_masks_hand_checked(device):
    """W = 3, L = 2 after a 2-node tree; a second request with W = 2, L = 1 (1 row)."""
    out = ops.build_lookahead_masks(
        torch.tensor([3, 2], device=device), torch.tensor([2, 1], device=device), 2, 6
    )
    # Columns: tree nodes 0, 1; rows 0..5 at columns 2..7. Request 0's rows: (0,1) (0,2)
    # (1,0) (1,1) (1,2), then one padding row.
    assert out.mask[0].int().tolist() == [
        [1, 0, 1, 0, 0, 0, 0, 0],  # (0,1): root, itself
        [1, 0, 1, 1, 0, 0, 0, 0],  # (0,2): root, (0,1), itself
        [1, 0, 0, 0, 1, 0, 0, 0],  # (1,0): root, itself
        [1, 0, 1, 0, 0, 1, 0, 0],  # (1,1): root, (0,1), itself
        [1, 0, 1, 1, 0, 0, 1, 0],  # (1,2): root, (0,1), (0,2), itself
        [0, 0, 0, 0, 0, 0, 0, 1],  # padding: itself
    ]
    assert out.positions.tolist() == [[1, 2, 1, 2, 3, -1], [1, -1, -1, -1, -1, -1]]
    assert out.packed_mask.shape == (2, 6, 1)
    assert out.packed_mask[0, :, 0].tolist() == [5, 13, 17, 37, 77, 128]


# Tree sizes of the reference comparison (also run by the CUDA kernel's emulation).
LOOKAHEAD_TREE_NODES = [1, 6, 31, 40]


def random_windows(batch, gen):
    """Random (window, levels) per request, one crossing a 32-bit mask word; returns them, the
    window rows of each request and a num_rows with padding rows for every request."""
    window = torch.randint(0, 9, (batch,), generator=gen)
    levels = torch.randint(0, 6, (batch,), generator=gen)
    window[0], levels[0] = 7, 4  # at least one request crosses a 32-bit word
    rows = [int(w * l - 1) if w * l else 0 for w, l in zip(window, levels)]
    return window, levels, rows, max(rows) + 3


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("tree_nodes", LOOKAHEAD_TREE_NODES)
def test_lookahead_masks_random_vs_reference_and_comb(device, gen, index_dtype, tree_nodes):
    batch = 5
    window, levels, rows, num_rows = random_windows(batch, gen)
    w, l = window.to(index_dtype).to(device), levels.to(index_dtype).to(device)
    got = ops.build_lookahead_masks(w, l, tree_nodes, num_rows)
    assert_lookahead_masks_equal(got, reference.build_lookahead_masks(w, l, tree_nodes, num_rows))
    assert torch.equal(got.packed_mask.cpu(), pack_tree_mask(got.mask.cpu()))
    trees = [tree_from_parents([-1] + [int(torch.randint(0, j, (1,), generator=gen))
                                       for j in range(1, tree_nodes)]) for _ in range(batch)]
    _, tree_parents = stack_trees(trees)
    for b in range(batch):
        parents = comb_parents(int(window[b]), int(levels[b]), tree_parents[b].tolist(), num_rows)
        comb = reference.build_tree_masks(torch.tensor([parents]), torch.tensor([0]))
        assert torch.equal(got.mask[b].cpu(), comb.mask[0, tree_nodes:])
        assert torch.equal(got.positions[b].cpu(), comb.depth[0, tree_nodes:])
        assert int((got.positions[b] >= 0).sum()) == rows[b]


def test_lookahead_masks_sizes(device):
    empty = ops.build_lookahead_masks(torch.tensor([0, 3], device=device),
                                      torch.tensor([5, 0], device=device), 3, 0)
    assert empty.mask.shape == (2, 0, 3) and empty.packed_mask.shape == (2, 0, 1)
    assert empty.positions.shape == (2, 0)
    none = ops.build_lookahead_masks(torch.zeros(0, dtype=torch.int64, device=device),
                                     torch.zeros(0, dtype=torch.int64, device=device), 1, 4)
    assert none.mask.shape == (0, 4, 5)
    single = ops.build_lookahead_masks(torch.tensor([1], device=device),
                                       torch.tensor([1], device=device), 0, 2)
    assert single.positions.tolist() == [[-1, -1]]  # W * L = 1: the root alone, no rows


BAD_LOOKAHEAD_ARGS = {
    "negative window": ([-1], [2], 1, 4, "window\\[0\\] = -1 is negative"),
    "negative levels": ([2], [-3], 1, 4, "levels\\[0\\] = -3 is negative"),
    "too many rows": ([4], [3], 1, 10, "more than num_rows = 10"),
    "huge window": ([2**40], [2**40], 1, 10, "more than num_rows = 10"),
    "no root": ([2], [2], 0, 3, "tree_nodes = 0"),
    "negative tree_nodes": ([2], [2], -1, 3, "tree_nodes must be >= 0"),
    "negative num_rows": ([2], [2], 1, -1, "num_rows must be >= 0"),
    "levels shape": ([2, 2], [2], 1, 3, "levels must have shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOOKAHEAD_ARGS))
def test_lookahead_masks_rejects(device, case):
    window, levels, nodes, rows, message = BAD_LOOKAHEAD_ARGS[case]
    with pytest.raises(ValueError, match=message):
        ops.build_lookahead_masks(torch.tensor(window, device=device),
                                  torch.tensor(levels, device=device), nodes, rows)


def test_lookahead_masks_rejects_dtypes(device):
    with pytest.raises(ValueError, match="int32 or int64"):
        ops.build_lookahead_masks(torch.tensor([2.0], device=device),
                                  torch.tensor([2.0], device=device), 1, 3)
    with pytest.raises(ValueError, match="levels must have dtype"):
        ops.build_lookahead_masks(torch.tensor([2], device=device),
                                  torch.tensor([2], dtype=torch.int32, device=device), 1, 3)
    with pytest.raises(ValueError, match="window must have shape"):
        ops.build_lookahead_masks(torch.tensor([[2]], device=device),
                                  torch.tensor([[2]], device=device), 1, 3)


def test_lookahead_masks_opcheck_and_fake(device):
    args = (torch.tensor([3, 5, 1], device=device), torch.tensor([4, 2, 1], device=device), 9, 11)
    torch.library.opcheck(torch.ops.specdec.build_lookahead_masks.default, args)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = ops.build_lookahead_masks(mode.from_tensor(args[0]), mode.from_tensor(args[1]), 9, 33)
    assert fake.mask.shape == (3, 33, 42) and fake.mask.dtype == torch.bool
    assert fake.packed_mask.shape == (3, 33, 2) and fake.packed_mask.dtype == torch.int32
    assert fake.positions.shape == (3, 33) and fake.positions.dtype == torch.int64


def test_lookahead_masks_compile(device):
    fn = torch.compile(lambda w, l: ops.build_lookahead_masks(w, l, 4, 8), fullgraph=True)
    w, l = torch.tensor([3, 2], device=device), torch.tensor([3, 1], device=device)
    assert_lookahead_masks_equal(fn(w, l), ops.build_lookahead_masks(w, l, 4, 8))


# ----------------------------------------------------------------------------- the doorway

VOCAB = 53


def visible_sequence(mask_row, positions, tokens):
    """Tokens a row sees, in position order (a causal sequence for lookahead rows)."""
    seen = mask_row.nonzero().flatten().tolist()
    ordered = sorted(seen, key=lambda k: positions[k])
    assert [positions[k] for k in ordered] == list(range(len(ordered)))  # consecutive
    return [tokens[k] for k in ordered]


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("device", DEVICES)
def test_extra_rows_forward_matches_plain_sequences(device, family, kernel):
    """A ragged batch runs a tree plus window rows in one forward: every tree node's logits
    equal a plain forward of prefix + its root path, every window row's a plain forward of
    prefix + the cells it attends to, and the tree rows are unchanged by the window rows."""
    from specdec_kernels.models.hf_tree_attention import register_tree_attention

    gen = torch.Generator().manual_seed(7)
    model = tiny_model(family, vocab=VOCAB, layers=2, sliding_window=4).to(device)
    if kernel:
        model.set_attn_implementation(register_tree_attention())
    runner = ModelRunner(model)
    prefixes = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (9, 4, 6)]
    trees = [
        tree_from_parents([-1, 0, 1, 0, 3], torch.randint(0, VOCAB, (5,), generator=gen)),
        tree_from_parents([-1, 0], torch.randint(0, VOCAB, (2,), generator=gen)),
        tree_from_parents([-1, 0, 0, 2], torch.randint(0, VOCAB, (4,), generator=gen)),
    ]
    tokens, parents = stack_trees(trees, device=device)
    nodes = tokens.shape[1]
    window, levels = torch.tensor([3, 2, 4]), torch.tensor([3, 2, 1])
    num_rows = 9
    masks = ops.build_lookahead_masks(window.to(device), levels.to(device), nodes, num_rows)
    rows = torch.randint(0, VOCAB, (3, num_rows), generator=gen).to(device)
    extra = ExtraRows(rows, masks.positions, masks.packed_mask)

    def run(with_extra):
        cache = runner.new_cache(3, 40)
        runner.append(cache, prefixes)
        block = torch.cat([tokens, rows], 1) if with_extra else tokens
        return runner.forward(cache, block, cache.host_lens, parents,
                              extra=extra if with_extra else None)

    logits = run(True)
    torch.testing.assert_close(logits[:, :nodes], run(False), atol=2e-5, rtol=1e-5)
    for b, (prefix, tree) in enumerate(zip(prefixes, trees)):
        for path in tree.paths():
            ids = torch.tensor([prefix + [tree.tokens[n] for n in path]], device=device)
            want = model(ids).logits[0, len(prefix):]
            torch.testing.assert_close(logits[b, path], want, atol=2e-5, rtol=1e-5)
        block_tokens = tree.tokens + [0] * (nodes - len(tree)) + rows[b].tolist()
        positions = [0] + [-1] * (nodes - 1) + masks.positions[b].tolist()
        for r in range(num_rows):
            if masks.positions[b, r] < 0:
                continue
            seq = visible_sequence(masks.mask[b, r].cpu(), positions, block_tokens)
            want = model(torch.tensor([prefix + seq], device=device)).logits[0, -1]
            torch.testing.assert_close(logits[b, nodes + r], want, atol=2e-5, rtol=1e-5)


def test_extra_rows_on_a_chain_and_bad_mask():
    """Extra rows ride on chains too (the chain is then the verified part), and a mask of the
    wrong width is rejected with the expected shape."""
    model = tiny_model("llama", vocab=VOCAB, layers=2)
    runner = ModelRunner(model)
    masks = ops.build_lookahead_masks(torch.tensor([2]), torch.tensor([2]), 3, 3)
    extra = ExtraRows(torch.tensor([[5, 6, 7]]), masks.positions, masks.packed_mask)
    cache = runner.new_cache(1, 20)
    runner.append(cache, [[1, 2, 3]])
    logits = runner.forward(cache, torch.tensor([[4, 8, 9, 5, 6, 7]]), cache.host_lens, extra=extra)
    want = model(torch.tensor([[1, 2, 3, 4, 8, 9]])).logits[0, 3:]
    torch.testing.assert_close(logits[0, :3], want, atol=2e-5, rtol=1e-5)
    # Rows (0, 1), (1, 0), (1, 1) at block columns 3, 4, 5; (1, 1) sees root, (0, 1), itself.
    want = model(torch.tensor([[1, 2, 3, 4, 5, 7]])).logits[0, -1]
    torch.testing.assert_close(logits[0, 5], want, atol=2e-5, rtol=1e-5)
    bad = ExtraRows(extra.tokens, extra.positions, torch.zeros(1, 3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[1, 3, 1\] for a block of T = 3"):
        runner.forward(cache, torch.tensor([[4, 8, 9, 5, 6, 7]]), cache.host_lens, extra=bad)


# ----------------------------------------------------------------------------- drafters


def test_ngram_pool_keeps_the_newest_per_key():
    pool = NgramPool(2)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    pool.add(1, (2, 3))  # already there: becomes the newest
    assert pool.candidates(1) == [(2, 3), (4, 5)]
    pool.add(1, (6, 7))  # full: the oldest, (4, 5), goes
    assert pool.candidates(1) == [(6, 7), (2, 3)]
    pool.add_sequence([9, 8, 7, 9, 8, 6], 3)
    assert pool.candidates(9) == [(8, 6), (8, 7)]
    assert pool.candidates(8) == [(7, 9)] and pool.candidates(5) == []
    assert pool.candidates(7) == [(9, 8)] and len(pool) == 6
    none = NgramPool(0)
    none.add(1, (2,))
    assert none.candidates(1) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(window=0), "window must be an int >= 1"),
        (dict(ngram=1), "ngram must be an int >= 2"),
        (dict(max_candidates=-1), "max_candidates must be an int >= 0"),
        (dict(window=2.5), "window must be an int"),
        (dict(ngram=True), "ngram must be an int"),
    ],
)
def test_lookahead_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LookaheadDrafter(**kwargs)


@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_jacobi_rejects_bad_parameters(value):
    with pytest.raises(ValueError, match="num_guesses must be (>= 1|an integer)"):
        JacobiDrafter(value)


def test_make_drafter_by_name():
    from specdec_kernels.decoding import make_drafter

    drafter = make_drafter("lookahead", window=3, ngram=4, max_candidates=5)
    assert drafter.describe()["window"] == 3 and drafter.max_block_width() == (5 + 3) * 3
    assert make_drafter("jacobi", num_guesses=6).max_block_width() == 7


CONFIGS = [(1, 2, 1), (3, 3, 2), (4, 4, 3), (2, 5, 0), (5, 3, 6)]


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_lookahead_greedy_equals_hf_on_tiny_models(config, kernel):
    """Ragged batch, every (W, N, G) shape: the warm-up, the steady state, G = 0, N = 2."""
    from specdec_kernels.models.hf_tree_attention import register_tree_attention

    model = tiny_model("qwen2", vocab=12, layers=2)
    if kernel:
        model.set_attn_implementation(register_tree_attention())
    prompts = [[1, 2, 3, 1, 2, 3, 4, 1, 2], [5, 6, 5, 6, 7], [9]]
    want = [hf_greedy(model, p, 30) for p in prompts]
    out = generate(model, prompts, drafter=LookaheadDrafter(*config), max_new_tokens=30,
                   eos_token_id=[])
    assert out.tokens == want
    if config[2] > 0:
        assert out.stats.tau > 1.2


def test_jacobi_greedy_equals_hf_on_tiny_models():
    model = tiny_model("llama", vocab=12, layers=2)
    prompts = [[1, 2, 3, 1, 2, 3, 4, 1, 2], [5, 6, 5, 6, 7]]
    want = [hf_greedy(model, p, 25) for p in prompts]
    for k in (1, 3, 6):
        out = generate(model, prompts, drafter=JacobiDrafter(k), max_new_tokens=25,
                       eos_token_id=[])
        assert out.tokens == want
        assert out.stats.tau > 1.1  # a small vocabulary loops: Jacobi guesses do get accepted


def test_lookahead_window_slides_with_absolute_positions():
    """In the steady state, level l + 1's guesses become level l's (same absolute positions)
    and the top level takes the step's outputs; the warm-up adds one level per step."""
    model = tiny_model("llama", vocab=12, layers=2)
    drafter = LookaheadDrafter(3, 4, 2)
    engine = Engine(model, drafter)
    params = SamplingParams.create(1, temperature=0.0)
    gen = engine.start([[1, 2, 3, 4]], params, StopCriteria([50], set(), [[]], None))
    sizes = []
    for _ in range(5):
        before = [list(level) for level in drafter._requests[0]["levels"]]
        engine.step(gen)
        after = drafter._requests[0]["levels"]
        sizes.append(len(after))
        assert all(len(level) == 3 for level in after)
        if len(before) == 3:  # full: shifted by one level
            assert after[0][1:] == before[1][1:] and after[1] == before[2]
    assert sizes == [2, 3, 3, 3, 3]
