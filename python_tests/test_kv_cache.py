"""KV-cache rollback ops vs the reference, opcheck, torch.compile and bad input."""

import pytest
import torch

from python_tests.conftest import DEVICES, FLOAT_DTYPES, INDEX_DTYPES
from specdec_kernels import ops, reference


def random_caches(num, shape, dtype, device, gen):
    return [torch.randn(shape, generator=gen).to(dtype).to(device) for _ in range(num)]


def random_accepts(cache_lens, capacity, max_accepted, gen, overlap):
    """Accepted positions per request: distinct, in [cache_len, capacity), in random order when
    `overlap` (so some sources are other rows' destinations), else increasing."""
    batch = len(cache_lens)
    positions = torch.full((batch, max_accepted), -1, dtype=torch.int64)
    counts = torch.zeros(batch, dtype=torch.int64)
    for b, start in enumerate(cache_lens):
        room = capacity - start
        n = int(torch.randint(0, min(max_accepted, room) + 1, (1,), generator=gen))
        chosen = start + torch.randperm(room, generator=gen)[:n]
        if not overlap:
            chosen = chosen.sort().values
        positions[b, :n] = chosen
        counts[b] = n
    return positions, counts


def as_index(t, index_dtype, device):
    return t.to(index_dtype).to(device).clone()  # a fresh tensor even when no conversion happens


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("head_dim", [40, 64, 128])
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("max_accepted", [6, 20])
def test_compact_matches_reference(device, gen, dtype, head_dim, batch, index_dtype, overlap,
                                   max_accepted):
    """On CUDA, up to 16 accepted rows per request go through registers, more through shared
    memory."""
    heads, capacity, layers = 3, 37, 3
    cache_lens = torch.randint(0, capacity - 1, (batch,), generator=gen).tolist()
    positions, counts = random_accepts(cache_lens, capacity, max_accepted, gen, overlap)
    caches = random_caches(2 * layers, (batch, heads, capacity, head_dim), dtype, device, gen)
    expected = [c.clone() for c in caches]
    lens = as_index(torch.tensor(cache_lens), index_dtype, device)
    expected_lens = lens.clone()
    args = (as_index(positions, index_dtype, device), as_index(counts, index_dtype, device))

    ops.compact_kv_cache_(caches, lens, *args)
    reference.compact_kv_cache_(expected, expected_lens, *args)

    assert torch.equal(lens, expected_lens)
    assert torch.equal(lens.cpu(), torch.tensor(cache_lens) + counts)
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)


def test_compact_moves_the_right_rows(device):
    """Hand-checked case, independent of the reference: a swap and a shift that overlap."""
    cache = torch.arange(2 * 1 * 6 * 2, dtype=torch.float32).reshape(2, 1, 6, 2).to(device)
    before = cache.clone()
    lens = torch.tensor([1, 2], device=device)
    # request 0: rows 2, 1 -> rows 1, 2 (a swap); request 1: rows 3, 4, 5 -> rows 2, 3, 4.
    positions = torch.tensor([[2, 1, -1], [3, 4, 5]], device=device)
    counts = torch.tensor([2, 3], device=device)
    ops.compact_kv_cache_([cache], lens, positions, counts)
    assert lens.tolist() == [3, 5]
    assert torch.equal(cache[0, 0, 1], before[0, 0, 2])
    assert torch.equal(cache[0, 0, 2], before[0, 0, 1])
    assert torch.equal(cache[1, 0, 2:5], before[1, 0, 3:6])
    untouched = [(0, 0), (0, 3), (0, 4), (0, 5), (1, 0), (1, 1), (1, 5)]
    for b, s in untouched:
        assert torch.equal(cache[b, 0, s], before[b, 0, s])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_compact_stacked_buffer(device, gen, dtype):
    layers, batch, heads, capacity, head_dim = 4, 5, 3, 29, 64
    stacked = torch.randn(layers, 2, batch, heads, capacity, head_dim, generator=gen)
    stacked = stacked.to(dtype).to(device)
    expected = stacked.clone()
    cache_lens = torch.randint(0, 20, (batch,), generator=gen).tolist()
    positions, counts = random_accepts(cache_lens, capacity, 5, gen, overlap=True)
    lens = torch.tensor(cache_lens, device=device)
    expected_lens = lens.clone()
    positions, counts = positions.to(device), counts.to(device)
    ops.compact_kv_cache_(stacked, lens, positions, counts)
    reference.compact_kv_cache_(expected, expected_lens, positions, counts)
    assert torch.equal(stacked, expected)
    assert torch.equal(lens, expected_lens)


def test_compact_non_contiguous_heads(device, gen):
    """Caches viewed as [B, H, S, D] from a [B, S, H, D] buffer (the other common layout)."""
    batch, heads, capacity, head_dim = 3, 3, 19, 40
    base = [torch.randn(batch, capacity, heads, head_dim, generator=gen).to(device) for _ in range(2)]
    caches = [b.transpose(1, 2) for b in base]
    expected = [c.clone() for c in caches]
    positions, counts = random_accepts([2, 0, 7], capacity, 4, gen, overlap=True)
    lens = torch.tensor([2, 0, 7], device=device)
    expected_lens = lens.clone()
    ops.compact_kv_cache_(caches, lens, positions.to(device), counts.to(device))
    reference.compact_kv_cache_(expected, expected_lens, positions.to(device), counts.to(device))
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)


def test_compact_zero_accepted_is_a_no_op(device, gen):
    caches = random_caches(2, (2, 3, 9, 64), torch.float16, device, gen)
    before = [c.clone() for c in caches]
    lens = torch.tensor([3, 4], device=device)
    ops.compact_kv_cache_(
        caches, lens, torch.full((2, 4), -1, device=device), torch.zeros(2, dtype=torch.int64, device=device)
    )
    assert lens.tolist() == [3, 4]
    assert all(torch.equal(a, b) for a, b in zip(caches, before))


def test_compact_zero_heads_advances_lens(device):
    """H = 0: no rows to move (and no empty CUDA grid); the lengths still advance."""
    caches = [torch.zeros(2, 0, 9, 64, device=device)]
    lens = torch.tensor([3, 4], device=device)
    positions = torch.tensor([[5, 3], [4, -1]], device=device)
    ops.compact_kv_cache_(caches, lens, positions, torch.tensor([2, 1], device=device))
    assert lens.tolist() == [5, 5]


def random_block_tables(batch, max_blocks, num_blocks, allocated, gen):
    """Disjoint random physical blocks; request b owns its first allocated[b] logical blocks."""
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((batch, max_blocks), -1, dtype=torch.int64)
    used = 0
    for b, count in enumerate(allocated):
        tables[b, :count] = perm[used : used + count]
        used += count
    return tables


def random_paged_accepts(batch, max_blocks, block_size, gen, slots=5):
    """A random paged layout and accepted rows: each request gets 1..max_blocks blocks (3
    spare blocks in the pool), a cache length inside them and up to ``slots`` distinct accepted
    positions (``-1`` padded) between that length and the end of its blocks.

    Returns
    -------
    num_blocks, tables ``[batch, max_blocks]``, cache_lens (list), positions ``[batch, slots]``,
    counts ``[batch]``
    """
    allocated = torch.randint(1, max_blocks + 1, (batch,), generator=gen).tolist()
    num_blocks = sum(allocated) + 3
    tables = random_block_tables(batch, max_blocks, num_blocks, allocated, gen)
    cache_lens = [int(torch.randint(0, a * block_size, (1,), generator=gen)) for a in allocated]
    positions = torch.full((batch, slots), -1, dtype=torch.int64)
    counts = torch.zeros(batch, dtype=torch.int64)
    for b, (start, a) in enumerate(zip(cache_lens, allocated)):
        room = a * block_size - start
        n = int(torch.randint(0, min(slots, room) + 1, (1,), generator=gen))
        positions[b, :n] = start + torch.randperm(room, generator=gen)[:n]
        counts[b] = n
    return num_blocks, tables, cache_lens, positions, counts


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("head_dim", [40, 128])
@pytest.mark.parametrize("block_size", [1, 5, 16])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_compact_paged_matches_reference(device, gen, dtype, head_dim, block_size, index_dtype):
    batch, heads, max_blocks, layers = 7, 3, 9, 2
    num_blocks, tables, cache_lens, positions, counts = random_paged_accepts(
        batch, max_blocks, block_size, gen
    )
    caches = random_caches(2 * layers, (num_blocks, block_size, heads, head_dim), dtype, device, gen)
    expected = [c.clone() for c in caches]
    idx = lambda t: as_index(t, index_dtype, device)  # noqa: E731
    lens, expected_lens = idx(torch.tensor(cache_lens)), idx(torch.tensor(cache_lens))
    args = (idx(positions), idx(counts))

    ops.compact_paged_kv_cache_(caches, idx(tables), lens, *args)
    reference.compact_paged_kv_cache_(expected, idx(tables), expected_lens, *args)

    assert torch.equal(lens, expected_lens)
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)


def forked_tables(fork_len, block_size, tails):
    """Two requests forked at fork_len: they share the blocks holding positions < fork_len
    (physical 0, 1, ...), then each has its own blocks (`tails` of them, ids after the shared)."""
    shared = -(-fork_len // block_size)
    tables = torch.full((2, shared + tails), -1, dtype=torch.int64)
    tables[:, :shared] = torch.arange(shared)
    for b in range(2):
        start = shared + b * tails
        tables[b, shared:] = torch.arange(start, start + tails)
    return tables


def test_compact_paged_forked_sequences(device, gen):
    """Forked requests sharing their committed blocks (all full) compact independently."""
    block_size, heads, dim = 4, 2, 64
    tables = forked_tables(8, block_size, 2)  # positions 0..7 shared (blocks 0, 1), both full
    caches = random_caches(2, (2 + 4, block_size, heads, dim), torch.float16, device, gen)
    expected = [c.clone() for c in caches]
    positions = torch.tensor([[9, 11, -1], [8, 12, 14]], device=device)
    counts = torch.tensor([2, 3], device=device)
    lens = torch.tensor([8, 8], device=device)
    expected_lens = lens.clone()
    ops.compact_paged_kv_cache_(caches, tables.to(device), lens, positions, counts, validate=True)
    reference.compact_paged_kv_cache_(expected, tables.to(device), expected_lens, positions, counts)
    assert torch.equal(lens, expected_lens)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected))


# Forked at 6 with block size 4 (tables [[0, 1, 2, 3], [0, 1, 4, 5]]): block 1 holds positions
# 4..7 of both and is only half full. (cache_lens, accept_positions, num_accepted).
FORK_CONFLICTS = {
    "both write the shared block": ([6, 6], [[8, 9], [8, 10]], [2, 2]),
    "one writes it, the other reads it": ([6, 6], [[7, -1], [8, -1]], [0, 1]),
    "a write into the other's committed prefix": ([3, 6], [[4, -1], [8, -1]], [1, 0]),
}


@pytest.mark.parametrize("case", sorted(FORK_CONFLICTS))
def test_compact_paged_rejects_writes_into_shared_blocks(device, case):
    """The precondition: a block that receives a row must belong to that request alone (copy a
    shared, partly filled block first). validate=True checks it: the kernels would race."""
    lens, rows, counts = (torch.tensor(x, device=device) for x in FORK_CONFLICTS[case])
    caches = [torch.zeros(2 + 4, 4, 2, 64, device=device)]
    before = lens.clone()
    with pytest.raises(ValueError, match="must be copied"):
        ops.compact_paged_kv_cache_(caches, forked_tables(6, 4, 2).to(device), lens, rows,
                                    counts, validate=True)
    assert torch.equal(lens, before) and caches[0].eq(0).all()  # nothing ran


# Table widths of the reference comparison (also run by the CUDA kernel's emulation).
ROLLBACK_MAX_BLOCKS = [3, 40]


def random_rollback(batch, max_blocks, block_size, gen):
    """Random tables (0..max_blocks blocks per request, full) and truncated lengths; returns
    (tables, old lengths, new lengths)."""
    allocated = torch.randint(0, max_blocks + 1, (batch,), generator=gen).tolist()
    tables = random_block_tables(batch, max_blocks, sum(allocated) + 1, allocated, gen)
    old = torch.tensor([a * block_size for a in allocated])
    return tables, old, (old.float() * torch.rand(batch, generator=gen)).long()


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("max_blocks", ROLLBACK_MAX_BLOCKS)
def test_rollback_paged_matches_reference(device, gen, index_dtype, max_blocks):
    batch, block_size = 7, 4
    tables, old, new = random_rollback(batch, max_blocks, block_size, gen)
    idx = lambda t: as_index(t, index_dtype, device)  # noqa: E731
    got_tables, got_lens = idx(tables), idx(old)
    want_tables, want_lens = idx(tables), idx(old)

    freed = ops.rollback_paged_kv_cache_(got_tables, got_lens, idx(new), block_size)
    want_freed = reference.rollback_paged_kv_cache_(want_tables, want_lens, idx(new), block_size)

    assert torch.equal(freed, want_freed)
    assert torch.equal(got_tables, want_tables)
    assert torch.equal(got_lens, idx(new))
    # Freed blocks plus kept blocks are exactly the blocks held before.
    for b in range(batch):
        kept = got_tables[b][got_tables[b] >= 0].tolist()
        released = freed[b][freed[b] >= 0].tolist()
        assert sorted(kept + released) == sorted(tables[b][tables[b] >= 0].tolist())
        assert len(kept) == -(-int(new[b]) // block_size)


def test_rollback_handles_holes(device):
    tables = torch.tensor([[7, -1, 3, 5, -1, 2]], device=device)
    lens = torch.tensor([24], device=device)
    freed = ops.rollback_paged_kv_cache_(tables, lens, torch.tensor([3], device=device), 4)
    assert tables.tolist() == [[7, -1, -1, -1, -1, -1]]
    assert freed.tolist() == [[3, 5, 2, -1, -1, -1]]
    assert lens.tolist() == [3]


def test_rollback_clears_every_truncated_entry_like_the_reference(device):
    # A caller's own negative sentinel past the new length is cleared too, never freed.
    tables = torch.tensor([[7, 4, -2, 5]], device=device)
    want_tables = tables.clone()
    lens, want_lens = torch.tensor([16], device=device), torch.tensor([16], device=device)
    new = torch.tensor([4], device=device)
    freed = ops.rollback_paged_kv_cache_(tables, lens, new, 4)
    want_freed = reference.rollback_paged_kv_cache_(want_tables, want_lens, new, 4)
    assert tables.tolist() == want_tables.tolist() == [[7, -1, -1, -1]]
    assert freed.tolist() == want_freed.tolist() == [[4, 5, -1, -1]]


# ----------------------------------------------------------------------------- opcheck, compile


def opcheck_samples(device):
    gen = torch.Generator().manual_seed(0)
    caches = random_caches(4, (3, 3, 11, 40), torch.float16, device, gen)
    compact = (
        caches,
        torch.tensor([1, 0, 4], device=device),
        torch.tensor([[3, 2], [0, -1], [6, 9]], device=device),
        torch.tensor([2, 1, 2], device=device),
    )
    paged_caches = random_caches(2, (6, 4, 3, 64), torch.float32, device, gen)
    tables = torch.tensor([[0, 1], [2, 3], [4, 5]], device=device)
    paged = (
        paged_caches,
        tables,
        torch.tensor([1, 2, 0], device=device),
        torch.tensor([[2, 7], [5, -1], [-1, -1]], device=device),
        torch.tensor([2, 1, 0], device=device),
    )
    rollback = (
        tables.clone(),
        torch.tensor([8, 5, 3], device=device),
        torch.tensor([3, 4, 0], device=device),
        4,
        torch.empty_like(tables),
    )
    return [
        (torch.ops.specdec.compact_kv_cache_.default, compact),
        (torch.ops.specdec.compact_paged_kv_cache_.default, paged),
        (torch.ops.specdec.rollback_paged_kv_cache_.default, rollback),
    ]


@pytest.mark.parametrize("which", range(3))
def test_opcheck(device, which):
    op, args = opcheck_samples(device)[which]
    torch.library.opcheck(op, args)


def test_torch_compile_fullgraph(device, gen):
    caches = random_caches(2, (2, 3, 13, 64), torch.float32, device, gen)
    expected = [c.clone() for c in caches]
    lens = torch.tensor([2, 5], device=device)
    expected_lens = lens.clone()
    positions = torch.tensor([[4, 3], [9, -1]], device=device)
    counts = torch.tensor([2, 1], device=device)

    @torch.compile(fullgraph=True)
    def step(k, v, cache_lens, positions, counts):
        ops.compact_kv_cache_([k, v], cache_lens, positions, counts)
        return cache_lens * 2

    doubled = step(caches[0], caches[1], lens, positions, counts)
    reference.compact_kv_cache_(expected, expected_lens, positions, counts)
    assert torch.equal(doubled, expected_lens * 2)
    assert torch.equal(lens, expected_lens)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected))


# ----------------------------------------------------------------------------- bad input


def compact_args(device, **overrides):
    args = dict(
        caches=[torch.zeros(2, 3, 8, 40, device=device) for _ in range(2)],
        cache_lens=torch.tensor([2, 3], device=device),
        accept_positions=torch.tensor([[2, 4], [5, -1]], device=device),
        num_accepted=torch.tensor([2, 1], device=device),
    )
    args.update(overrides)
    return args


BAD_COMPACT = {
    "position past capacity": (dict(accept_positions=[[2, 8], [5, -1]]), "points past"),
    "position in committed prefix": (dict(accept_positions=[[1, 4], [5, -1]]), "committed prefix"),
    "too many accepted": (dict(num_accepted=[3, 1]), "num_accepted"),
    "negative accepted": (dict(num_accepted=[-1, 1]), "num_accepted"),
    "destination past capacity": (dict(cache_lens=[7, 3], accept_positions=[[7, 7], [5, -1]]), "lies past"),
    "lens shape": (dict(cache_lens=[2, 3, 4]), "cache_lens must have shape"),
    "positions shape": (dict(accept_positions=[2, 4]), "accept_positions must have shape"),
    "mixed index dtypes": (dict(num_accepted=torch.tensor([2, 1], dtype=torch.int32)), "num_accepted must have dtype"),
    "float index": (dict(cache_lens=torch.tensor([2.0, 3.0])), "int32 or int64"),
}


@pytest.mark.parametrize("case", sorted(BAD_COMPACT))
def test_compact_rejects_bad_indices(device, case):
    overrides, message = BAD_COMPACT[case]
    overrides = {
        k: (torch.tensor(v, device=device) if isinstance(v, list) else v.to(device))
        for k, v in overrides.items()
    }
    args = compact_args(device, **overrides)
    before = [c.clone() for c in args["caches"]]
    with pytest.raises(ValueError, match=message):
        ops.compact_kv_cache_(**args, validate=True)
    assert all(torch.equal(a, b) for a, b in zip(args["caches"], before)), "bad call wrote data"


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_compact_unvalidated_indices_stay_inside_the_cache(gen):
    """Without validate (no host copy on CUDA), positions and counts outside the cache are
    skipped by the kernel: no fault, nothing outside the cache written."""
    storage = torch.randn(3 * 2 * 2 * 8 * 64, generator=gen).half().cuda()
    cache = storage[: 2 * 2 * 8 * 64].view(2, 2, 8, 64)
    guard = storage[2 * 2 * 8 * 64 :].clone()
    before = cache.clone()
    lens = torch.tensor([6, 2], device="cuda")
    positions = torch.tensor([[7, 9, -3], [100, 5, 6]], device="cuda")
    ops.compact_kv_cache_([cache], lens, positions, torch.tensor([3, 9], device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(storage[2 * 2 * 8 * 64 :], guard)
    assert torch.equal(cache[0, :, 6], before[0, :, 7])
    assert torch.equal(cache[1, :, 3:5], before[1, :, 5:7])
    lens = torch.tensor([6, 2], device="cuda")  # the call above advanced them in place
    with pytest.raises(ValueError, match="points past"):
        ops.compact_kv_cache_([cache], lens, positions, torch.tensor([3, 3], device="cuda"),
                              validate=True)


def test_compact_rejects_bad_caches(device):
    good = compact_args(device)
    cases = {
        "has shape": [torch.zeros(2, 3, 8, 40, device=device), torch.zeros(2, 3, 9, 40, device=device)],
        "has dtype": [torch.zeros(2, 3, 8, 40, device=device), torch.zeros(2, 3, 8, 40, device=device).half()],
        "contiguous in its last": [torch.zeros(2, 3, 40, 8, device=device).transpose(2, 3)] * 1,
        "overlaps": [good["caches"][0], good["caches"][0]],
        "overlapping elements": [torch.zeros(1, 3, 8, 40, device=device).expand(2, 3, 8, 40)],
        "4-D": [torch.zeros(2, 3, 8, device=device)],
        "at least one": [],
    }
    for message, caches in cases.items():
        with pytest.raises(ValueError, match=message):
            ops.compact_kv_cache_(**{**good, "caches": caches})
    shared = torch.zeros(2, 3, 9, 40, device=device)
    with pytest.raises(ValueError, match="overlaps"):  # two views one row apart
        ops.compact_kv_cache_(**{**good, "caches": [shared[:, :, :8], shared[:, :, 1:]]})
    with pytest.raises(ValueError, match="stacked cache"):
        ops.compact_kv_cache_(**{**good, "caches": torch.zeros(2, 2, 2, 3, 8, device=device)[0]})


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_compact_rejects_mixed_devices():
    args = compact_args("cuda", cache_lens=torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="cache_lens must be on"):
        ops.compact_kv_cache_(**args)


def test_paged_rejects_unallocated_block(device):
    caches = [torch.zeros(4, 4, 3, 40, device=device)]
    tables = torch.tensor([[0, -1], [1, 2]], device=device)
    lens = torch.tensor([3, 1], device=device)
    with pytest.raises(ValueError, match="block must be allocated"):
        ops.compact_paged_kv_cache_(
            caches, tables, lens, torch.tensor([[5, -1], [2, -1]], device=device),
            torch.tensor([1, 1], device=device), validate=True,
        )
    with pytest.raises(ValueError, match="block must be allocated"):  # block id >= num_blocks
        ops.compact_paged_kv_cache_(
            caches, torch.tensor([[0, 9], [1, 2]], device=device), lens,
            torch.tensor([[5, -1], [2, -1]], device=device), torch.tensor([1, 1], device=device),
            validate=True,
        )
    assert lens.tolist() == [3, 1]


def test_rollback_rejects_growth_and_bad_shapes(device):
    tables = torch.tensor([[0, 1], [2, -1]], device=device)
    lens = torch.tensor([5, 3], device=device)
    with pytest.raises(ValueError, match="only truncates"):
        ops.rollback_paged_kv_cache_(tables, lens, torch.tensor([6, 3], device=device), 4,
                                     validate=True)
    with pytest.raises(ValueError, match="new_lens must have shape"):
        ops.rollback_paged_kv_cache_(tables, lens, torch.tensor([1], device=device), 4)
    with pytest.raises(ValueError, match="block_size must be positive"):
        ops.rollback_paged_kv_cache_(tables, lens, torch.tensor([1, 1], device=device), 0)
    assert tables.tolist() == [[0, 1], [2, -1]] and lens.tolist() == [5, 3]
