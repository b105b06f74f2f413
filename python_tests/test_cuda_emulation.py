"""The CUDA kernels of tree attention, KV compaction and rollback, and the mask builders, run by
the CPU emulator (python_tests/emulation.py) with their launchers' configuration, against the
reference: their indexing, mma.sync / ldmatrix fragment layouts, cp.async pipelining, masks,
splits and combine, warp ballots and block scans are tested without a GPU, and every load and
store is checked (shared-memory races, guard zones around every buffer). Cases run in the
emulator's two schedules: warps in lockstep with cp.async data landing at the wait (a read
before its wait or barrier sees stale data), and adversarial, each warp running ahead alone with
data landing at issue (a stage refilled while another warp still reads it is overwritten).

On a GPU the same shapes run for real in test_tree_attention.py, test_kv_cache.py, test_tree.py
and test_lookahead.py, whose case builders these tests share.
"""

import pytest
import torch

from python_tests import emulation
from python_tests.conftest import INDEX_DTYPES
from python_tests.test_kv_cache import (
    ROLLBACK_MAX_BLOCKS,
    random_accepts,
    random_paged_accepts,
    random_rollback,
)
from python_tests.test_lookahead import LOOKAHEAD_TREE_NODES, random_windows
from python_tests.test_tree import (
    MEDUSA_NODES,
    RAGGED_NODES,
    random_medusa_parents,
    random_ragged_trees,
)
from python_tests.test_tree_attention import (
    assert_flash_rule,
    make_case,
    poison_unused_rows,
    random_parents,
)
from specdec_kernels import reference
from specdec_kernels.tree import pack_tree_mask, stack_trees, tree_from_parents

pytestmark = pytest.mark.skipif(
    emulation.library() is None, reason=emulation.UNAVAILABLE or "emulator unavailable"
)


# ----------------------------------------------------------------------------- tree attention

# (dtype, head dim, (Hq, Hkv), T, cache_lens, SMs): tensor-core instantiations 64/80/96/128/256,
# head dims padded to the next one (40, 72, 136), odd T, GQA/MQA, one or two m16 tiles per warp
# (T * G above 64), trees crossing the 32-node word, ragged lengths and several splits (few SMs:
# a small wave keeps splits few but long; many SMs: many short splits).
MMA_CASES = [
    (torch.float16, 64, (8, 2), 13, [0, 77, 150], 132),
    (torch.bfloat16, 64, (32, 8), 21, [5, 64], 2),
    (torch.float16, 80, (6, 1), 13, [100, 3], 132),
    (torch.bfloat16, 96, (8, 2), 33, [31, 0], 132),
    (torch.float16, 128, (4, 4), 9, [0, 0, 140], 132),
    (torch.bfloat16, 128, (8, 2), 64, [200, 63], 132),
    (torch.float16, 128, (16, 2), 17, [300, 129], 3),
    (torch.bfloat16, 256, (8, 1), 13, [90, 7], 132),
    (torch.float16, 256, (2, 2), 64, [33, 250], 4),
    (torch.float16, 40, (8, 2), 7, [10, 70], 132),
    (torch.bfloat16, 72, (4, 1), 19, [65, 1], 132),
    (torch.float16, 136, (4, 2), 11, [17, 96], 132),
    (torch.float16, 64, (4, 4), 1, [0, 57, 300], 132),
]


@pytest.mark.parametrize("adversarial", [False, True])
@pytest.mark.parametrize("case", range(len(MMA_CASES)))
def test_tensor_core_kernel(gen, case, adversarial):
    dtype, dim, (q_heads, kv_heads), tokens, lens, sms = MMA_CASES[case]
    args = make_case(gen, "cpu", dtype, batch=len(lens), tokens=tokens, q_heads=q_heads,
                     kv_heads=kv_heads, head_dim=dim, cache_lens=lens,
                     index_dtype=torch.int32 if case % 2 else torch.int64)
    out, (tile_dim, splits, rows_per_cta, _) = emulation.tree_attention(
        *args, dim**-0.5, sms=sms, adversarial=adversarial)
    assert tile_dim == {40: 64, 72: 80, 136: 256}.get(dim, dim)
    assert rows_per_cta == (128 if tokens * q_heads // kv_heads > 64 and tile_dim <= 128 else 64)
    if sms == 132:
        assert splits > 1  # the combine ran
    assert_flash_rule(out, *args, dim**-0.5)


@pytest.mark.parametrize("dtype,dim,tensor_cores", [
    (torch.float32, 64, True), (torch.float32, 36, True), (torch.float16, 36, True),
    (torch.bfloat16, 12, True), (torch.float16, 64, False),
])
def test_simt_kernel(gen, dtype, dim, tensor_cores):
    """fp32, 2-byte types with a head dim that is not a multiple of 8, and (tensor_cores=False,
    as the launcher decides for unaligned views or pre-sm_80 devices) any 2-byte input."""
    args = make_case(gen, "cpu", dtype, batch=2, tokens=11, q_heads=6, kv_heads=2, head_dim=dim,
                     cache_lens=[45, 0])
    out, (tile_dim, splits, _, _) = emulation.tree_attention(*args, dim**-0.5, sms=64,
                                                             tensor_cores=tensor_cores)
    assert tile_dim == 0 and splits > 1
    assert_flash_rule(out, *args, dim**-0.5)


@pytest.mark.parametrize("tensor_cores", [True, False])
def test_masks_empty_rows_and_strided_views(gen, tensor_cores):
    """Arbitrary bit patterns, a row with no visible key (zero, not NaN) over an empty prefix,
    q as a transposed [B, H, T, D] tensor and caches as views of [B, S, H, D] buffers."""
    batch, tokens, heads, dim, capacity = 2, 40, 4, 64, 60
    bits = torch.rand(batch, tokens, tokens, generator=gen) < 0.3
    bits[0, 5] = False
    packed = pack_tree_mask(bits)
    lens = torch.tensor([0, 9])
    q = torch.randn(batch, heads, tokens, dim, generator=gen).half().transpose(1, 2)
    k = torch.randn(batch, capacity, heads, dim, generator=gen).half().transpose(1, 2)
    v = torch.randn(batch, capacity, heads, dim, generator=gen).half().transpose(1, 2)
    out, (tile_dim, *_) = emulation.tree_attention(q, k, v, lens, packed, dim**-0.5,
                                                   tensor_cores=tensor_cores, sms=6)
    assert (tile_dim != 0) == tensor_cores
    assert out[0, 5].eq(0).all() and torch.isfinite(out).all()
    assert_flash_rule(out, q, k, v, lens, packed, dim**-0.5)


def test_out_of_range_lengths_stay_inside_the_cache(gen):
    """Unvalidated lengths outside [0, S - T] are clamped: no read outside K/V (the emulator
    checks every cp.async source), every output written."""
    args = list(make_case(gen, "cpu", torch.float16, batch=3, tokens=5, q_heads=4, kv_heads=2,
                          head_dim=64, cache_lens=[0, 10, 20], extra=0))
    args[3] = torch.tensor([-7, 10**6, 20])
    out, _ = emulation.tree_attention(*args, 0.125, sms=132)
    assert torch.isfinite(out).all()
    clamped = torch.tensor([0, args[1].shape[2] - 5, 20])
    assert_flash_rule(out, args[0], args[1], args[2], clamped, args[4], 0.125)


@pytest.mark.parametrize("dim,dtype", [(64, torch.float16), (256, torch.bfloat16),
                                       (64, torch.float32)])
def test_rows_past_the_keys_are_never_used(gen, dim, dtype):
    """Cache rows past cache_lens[b] + T hold NaN (as an unwritten cache may): tails of key
    tiles and splits are zero-filled, not read, so the output stays finite and right."""
    args = make_case(gen, "cpu", dtype, batch=3, tokens=7, q_heads=4, kv_heads=2, head_dim=dim,
                     cache_lens=[0, 61, 33], extra=40)
    poison_unused_rows(args[1], args[2], args[3], 7)
    out, _ = emulation.tree_attention(*args, dim**-0.5, sms=132)
    assert torch.isfinite(out).all()
    assert_flash_rule(out, *args, dim**-0.5)


def test_tree_from_build_tree_masks(gen):
    """The engine's path: masks from reference.build_tree_masks of ragged trees."""
    batch, tokens, dim = 3, 26, 128
    _, parents = stack_trees([tree_from_parents(random_parents(n, gen)) for n in (26, 9, 17)])
    lens = torch.tensor([130, 0, 64])
    packed = reference.build_tree_masks(parents, lens).packed_mask
    capacity = 130 + tokens
    q = torch.randn(batch, tokens, 16, dim, generator=gen).bfloat16()
    k = torch.randn(batch, 4, capacity, dim, generator=gen).bfloat16()
    v = torch.randn(batch, 4, capacity, dim, generator=gen).bfloat16()
    out, _ = emulation.tree_attention(q, k, v, lens, packed, dim**-0.5, sms=132,
                                      adversarial=True)
    assert_flash_rule(out, q, k, v, lens, packed, dim**-0.5)


# ----------------------------------------------------------------------------- KV compaction


@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 64), (torch.float32, 40),
                                            (torch.bfloat16, 3)])
@pytest.mark.parametrize("max_accepted", [6, 16, 20])
def test_compact(gen, dtype, head_dim, max_accepted):
    """Register kernel (up to 16 accepted rows) and shared-memory kernel (wider), overlapping
    sources and destinations, vector widths 16 / 8 / 2 bytes, int64 and int32 indices."""
    batch, heads, capacity, layers = 5, 3, 37, 2
    index = torch.int32 if max_accepted == 16 else torch.int64
    cache_lens = torch.randint(0, capacity - 1, (batch,), generator=gen).tolist()
    positions, counts = random_accepts(cache_lens, capacity, max_accepted, gen, overlap=True)
    positions, counts = positions.to(index), counts.to(index)
    caches = [torch.randn(batch, heads, capacity, head_dim, generator=gen).to(dtype)
              for _ in range(2 * layers)]
    expected = [c.clone() for c in caches]
    lens, expected_lens = torch.tensor(cache_lens, dtype=index), torch.tensor(cache_lens, dtype=index)
    kernel = emulation.compact(caches, lens, positions, counts, adversarial=head_dim == 40)
    reference.compact_kv_cache_(expected, expected_lens, positions, counts)
    assert kernel == (1 if max_accepted <= 16 else 2)
    assert torch.equal(lens, expected_lens)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected))


@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_compact_paged(gen, block_size):
    batch, heads, max_blocks, head_dim = 6, 2, 9, 64
    num_blocks, tables, cache_lens, positions, counts = random_paged_accepts(
        batch, max_blocks, block_size, gen
    )
    shape = (num_blocks, block_size, heads, head_dim)
    caches = [torch.randn(shape, generator=gen).half() for _ in range(2)]
    expected = [c.clone() for c in caches]
    lens, expected_lens = torch.tensor(cache_lens), torch.tensor(cache_lens)
    emulation.compact(caches, lens, positions, counts, tables, adversarial=True)
    reference.compact_paged_kv_cache_(expected, tables, expected_lens, positions, counts)
    assert torch.equal(lens, expected_lens)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected))


def test_compact_unchecked_indices_stay_inside_the_cache(gen):
    """Unvalidated positions and lengths past the cache are skipped, never written."""
    caches = [torch.randn(2, 2, 8, 64, generator=gen).half()]
    before = caches[0].clone()
    lens = torch.tensor([6, 2])
    positions = torch.tensor([[7, 9, -3], [100, 5, 6]])
    counts = torch.tensor([3, 9])  # request 1: more than P
    emulation.compact(caches, lens, positions, counts)
    assert torch.equal(caches[0][0, :, 6], before[0, :, 7])  # 7 -> 6; 9 and -3 skipped
    assert torch.equal(caches[0][0, :, 7], before[0, :, 7])
    assert torch.equal(caches[0][1, :, 3:5], before[1, :, 5:7])  # 100 skipped; 5, 6 -> 3, 4
    assert torch.equal(caches[0][1, :, 2], before[1, :, 2])


# ----------------------------------------------------------------------------- paged rollback


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("max_blocks", ROLLBACK_MAX_BLOCKS)
def test_rollback_paged(gen, index_dtype, max_blocks):
    """One warp per request, freed ids compacted by ballot, tables wider than a warp; every
    entry of freed_blocks written (it starts poisoned)."""
    batch, block_size = 7, 4
    tables, old, new = (t.to(index_dtype) for t in random_rollback(batch, max_blocks, block_size, gen))
    got_tables, got_lens = tables.clone(), old.clone()
    freed = torch.full_like(tables, -7)
    emulation.rollback(got_tables, got_lens, new, block_size, freed,
                       adversarial=max_blocks > 32)
    want_tables, want_lens = tables.clone(), old.clone()
    want_freed = reference.rollback_paged_kv_cache_(want_tables, want_lens, new, block_size)
    assert torch.equal(freed, want_freed) and torch.equal(got_tables, want_tables)
    assert torch.equal(got_lens, new)


def test_rollback_holes_and_sentinels():
    tables = torch.tensor([[7, -1, 3, 5, -1, 2], [7, 4, -2, 5, -1, -1]])
    lens, freed = torch.tensor([24, 16]), torch.full_like(tables, -7)
    emulation.rollback(tables, lens, torch.tensor([3, 4]), 4, freed)
    assert tables.tolist() == [[7] + [-1] * 5] * 2
    assert freed.tolist() == [[3, 5, 2, -1, -1, -1], [4, 5, -1, -1, -1, -1]]
    assert lens.tolist() == [3, 4]


# ----------------------------------------------------------------------------- mask builders


def assert_masks_equal(got, want):
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("num_nodes", RAGGED_NODES)
def test_build_tree_masks_random_ragged(gen, index_dtype, num_nodes):
    """A block per request, more nodes than threads' first pass for 70 (a scan per 256 nodes
    is one chunk: several warps' leaves), trees crossing the 32-node word."""
    _, parents, prefix = random_ragged_trees(5, num_nodes, index_dtype, gen)
    got = emulation.build_tree_masks(parents, prefix, adversarial=num_nodes % 2 == 1)
    assert_masks_equal(got, reference.build_tree_masks(parents, prefix))


@pytest.mark.parametrize("num_nodes", MEDUSA_NODES)
def test_build_tree_masks_medusa_choices(gen, num_nodes):
    parents = random_medusa_parents(num_nodes, gen)
    prefix = torch.tensor([0, 17, 4096])
    assert_masks_equal(emulation.build_tree_masks(parents, prefix),
                       reference.build_tree_masks(parents, prefix))


def test_build_tree_masks_wider_than_a_block(gen):
    """More nodes than the block's 256 threads: every loop over nodes and the leaf scan run in
    several chunks."""
    _, parents, prefix = random_ragged_trees(2, 300, torch.int64, gen)
    parents[1] = torch.tensor([-1] + list(range(299)))  # a chain: one leaf, the last node
    assert_masks_equal(emulation.build_tree_masks(parents, prefix, adversarial=True),
                       reference.build_tree_masks(parents, prefix))


def test_build_tree_masks_empty_requests_and_sizes():
    parents = torch.tensor([[-2, -2, -2], [-1, 0, 1]])
    prefix = torch.tensor([4, 0])
    assert_masks_equal(emulation.build_tree_masks(parents, prefix),
                       reference.build_tree_masks(parents, prefix))
    empty = emulation.build_tree_masks(torch.zeros(2, 0, dtype=torch.int64), torch.tensor([1, 2]))
    assert empty[0].shape == (2, 0, 0) and empty[5].tolist() == [0, 0]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("tree_nodes", LOOKAHEAD_TREE_NODES)
def test_build_lookahead_masks(gen, index_dtype, tree_nodes):
    window, levels, _, num_rows = random_windows(5, gen)
    window, levels = window.to(index_dtype), levels.to(index_dtype)
    got = emulation.build_lookahead_masks(window, levels, tree_nodes, num_rows,
                                          adversarial=tree_nodes > 30)
    assert_masks_equal(got, reference.build_lookahead_masks(window, levels, tree_nodes, num_rows))


def test_build_lookahead_masks_rows_past_a_block():
    """More window rows than a block's 128 threads, and the padding rows of short windows."""
    window, levels = torch.tensor([12, 3, 0]), torch.tensor([14, 2, 4])
    got = emulation.build_lookahead_masks(window, levels, 2, 170)
    assert_masks_equal(got, reference.build_lookahead_masks(window, levels, 2, 170))


def test_compact_destinations_past_the_cache_are_skipped(gen):
    """Unvalidated lengths whose destinations run past the capacity: those rows are skipped
    (not written into the next head's rows, nor past the buffer); the lengths still advance."""
    caches = [torch.randn(2, 2, 8, 64, generator=gen).half()]
    before = caches[0].clone()
    lens = torch.tensor([7, 7])
    emulation.compact(caches, lens, torch.tensor([[7, 7], [7, 7]]), torch.tensor([2, 2]))
    assert torch.equal(caches[0], before) and lens.tolist() == [9, 9]
