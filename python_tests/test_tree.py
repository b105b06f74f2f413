"""Tree utilities (specdec_kernels.tree) and the tree-mask builder op vs its reference."""

import numpy as np
import pytest
import torch

from python_tests.conftest import INDEX_DTYPES
from specdec_kernels import ops, reference
from specdec_kernels.models.hf_masks import (
    prefix_valid_from_lens,
    tree_attention_bias_4d,
    tree_attention_mask_4d,
)
from specdec_kernels.tree import (
    PAD_PARENT,
    Tree,
    pack_tree_mask,
    sequence_nodes,
    stack_trees,
    tree_from_choices,
    tree_from_parents,
    tree_from_sequences,
    unpack_tree_mask,
)


def random_parents(num_nodes, gen):
    """A random valid parent array: every node picks an earlier node as parent."""
    return [-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, num_nodes)]


def random_choices(num_nodes, gen, max_rank=4):
    """A random Medusa choice list: each new node is the next-ranked child of an existing one."""
    paths, children = [()], {(): 0}
    while len(paths) < num_nodes:
        parent = paths[int(torch.randint(0, len(paths), (1,), generator=gen))]
        if children[parent] >= max_rank:
            continue
        child = parent + (children[parent],)
        children[parent] += 1
        children[child] = 0
        paths.append(child)
    return [list(p) for p in paths[1:]]


# ----------------------------------------------------------------------------- Tree builders


def test_tree_from_parents_properties():
    tree = tree_from_parents([-1, 0, 0, 1, 1, 2, 3], tokens=[9, 8, 7, 6, 5, 4, 3])
    assert len(tree) == 7
    assert tree.depths == [0, 1, 1, 2, 2, 2, 3]
    assert tree.depth == 3
    assert tree.children == [[1, 2], [3, 4], [5], [6], [], [], []]
    assert tree.leaves == [4, 5, 6]
    assert tree.path(6) == [0, 1, 3, 6]
    assert tree.paths() == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]
    assert tree.tokens == [9, 8, 7, 6, 5, 4, 3]
    assert tree_from_parents(torch.tensor([-1, 0]), np.array([3, 4])).tokens == [3, 4]
    assert tree_from_parents([-1]).leaves == [0]


BAD_PARENTS = {
    "empty": ([], "at least its root"),
    "no root": ([0, 0], "exactly one root"),
    "two roots": ([-1, 0, -1], "exactly one root"),
    "root not first": ([1, -1], "root must be node 0"),
    "out of range": ([-1, 5], "not a node index"),
    "negative": ([-1, -3], "not a node index"),
    "self parent": ([-1, 1], "cycle"),
    "cycle": ([-1, 0, 3, 2], "cycle"),
    "parent after child": ([-1, 2, 0], "must come before its child"),
    "float": ([-1, 0.0], "must be an int"),
    "bool": ([-1, True], "must be an int"),
}


@pytest.mark.parametrize("case", sorted(BAD_PARENTS))
def test_tree_from_parents_rejects(case):
    parents, message = BAD_PARENTS[case]
    with pytest.raises(ValueError, match=message):
        tree_from_parents(parents)


def test_tree_limits_and_tokens():
    chain = [-1] + list(range(9))
    with pytest.raises(ValueError, match="max_depth=8"):
        tree_from_parents(chain, max_depth=8)
    assert tree_from_parents(chain, max_depth=9).depth == 9
    with pytest.raises(ValueError, match="max_nodes=5"):
        tree_from_parents(chain, max_nodes=5)
    with pytest.raises(ValueError, match="tokens has 2 entries for 3 nodes"):
        tree_from_parents([-1, 0, 0], tokens=[1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        tree_from_parents([-1, 0], tokens=[1, -2])
    with pytest.raises(ValueError, match="not in a tree"):
        tree_from_parents([-1, 0]).path(2)
    with pytest.raises(ValueError, match="exactly one root"):
        Tree([0, -1, -1])  # the dataclass validates too


def test_tree_from_choices_medusa_order():
    tree = tree_from_choices([[1], [0, 0], [0], [0, 1], [1, 0], [0, 0, 0], [2]])
    # Nodes in (depth, path) order: [0], [1], [2], [0,0], [0,1], [1,0], [0,0,0].
    assert tree.parents == [-1, 0, 0, 0, 1, 1, 2, 4]
    assert tree.ranks == [-1, 0, 1, 2, 0, 1, 0, 0]
    assert tree.depths == [0, 1, 1, 1, 2, 2, 2, 3]
    assert tree.tokens is None
    assert tree.with_tokens(range(10, 18)).tokens == list(range(10, 18))
    assert tree_from_choices([]).parents == [-1]


@pytest.mark.parametrize(
    "choices, message",
    [
        ([[0], [1, 0]], "has no parent"),
        ([[0], [0]], "more than once"),
        ([[0], []], "empty"),
        ([[0], [0, -1]], "negative rank"),
        ([[0], [0, 0], [0, 0, 0]], "max_depth=2"),
    ],
)
def test_tree_from_choices_rejects(choices, message):
    with pytest.raises(ValueError, match=message):
        tree_from_choices(choices, max_depth=2)


def test_tree_from_sequences_merges_prefixes():
    drafts = [[5, 6, 7], [5, 6, 8], [5, 9], [], [4], [5, 6, 7]]
    tree = tree_from_sequences(drafts, root_token=3)
    assert tree.tokens == [3, 5, 6, 7, 8, 9, 4]
    assert tree.parents == [-1, 0, 1, 2, 2, 1, 0]
    for seq in drafts:
        nodes = sequence_nodes(tree, seq)
        assert [tree.tokens[n] for n in nodes] == seq
        assert tree.path(nodes[-1])[1:] == nodes if nodes else True
    with pytest.raises(ValueError, match="does not continue"):
        sequence_nodes(tree, [5, 7])
    with pytest.raises(ValueError, match="max_nodes=4"):
        tree_from_sequences(drafts, 3, max_nodes=4)
    with pytest.raises(ValueError, match="max_depth=2"):
        tree_from_sequences(drafts, 3, max_depth=2)
    with pytest.raises(ValueError, match="negative token"):
        tree_from_sequences([[1, -1]], 3)


def test_tree_from_sequences_random_paths_are_kept(gen):
    """Every merged sequence is a root path spelling exactly its tokens; the tree has exactly
    as many nodes as distinct non-empty prefixes."""
    seqs = [torch.randint(0, 3, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(20)]
    tree = tree_from_sequences(seqs, root_token=0)
    prefixes = {tuple(s[:i]) for s in seqs for i in range(1, len(s) + 1)}
    assert len(tree) == 1 + len(prefixes)
    for s in seqs:
        if s:
            path = tree.path(sequence_nodes(tree, s)[-1])
            assert [tree.tokens[n] for n in path] == [0] + s


def test_stack_trees():
    a = tree_from_parents([-1, 0, 0, 1], tokens=[1, 2, 3, 4])
    b = tree_from_parents([-1, 0])
    tokens, parents = stack_trees([a, b])
    assert parents.tolist() == [[-1, 0, 0, 1], [-1, 0, PAD_PARENT, PAD_PARENT]]
    assert tokens.tolist() == [[1, 2, 3, 4], [0, 0, 0, 0]]
    assert tokens.dtype == parents.dtype == torch.int64
    tokens, parents = stack_trees([b], num_nodes=6)
    assert parents.shape == (1, 6) and parents[0, 2:].eq(PAD_PARENT).all()
    with pytest.raises(ValueError, match="smaller than the largest tree"):
        stack_trees([a], num_nodes=3)
    with pytest.raises(ValueError, match="at least one tree"):
        stack_trees([])


@pytest.mark.parametrize("num", [1, 31, 32, 33, 70])
def test_pack_unpack_roundtrip(gen, num):
    mask = torch.rand(3, 5, num, generator=gen) < 0.5
    packed = pack_tree_mask(mask)
    assert packed.dtype == torch.int32 and packed.shape == (3, 5, -(-num // 32))
    assert torch.equal(unpack_tree_mask(packed, num), mask)
    assert bool(pack_tree_mask(torch.ones(1, 32, dtype=torch.bool))[0, 0] == -1)  # bit 31 set


# ----------------------------------------------------------------------------- mask builder


def assert_masks_equal(got, want):
    for name, a, b in zip(got._fields, got, want):
        assert a.dtype == b.dtype, name
        assert torch.equal(a.cpu(), b.cpu()), name


def test_build_tree_masks_hand_checked(device):
    """Independent of the reference: a small tree and a padded, ragged second request."""
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, -2, -2]], device=device)
    out = ops.build_tree_masks(parents, torch.tensor([10, 3], device=device))
    assert out.mask[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert out.mask[1].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert out.packed_mask[:, :, 0].tolist() == [[1, 3, 5, 11], [1, 3, 4, 8]]
    assert out.depth.tolist() == [[0, 1, 1, 2], [0, 1, -1, -1]]
    assert out.position_ids.tolist() == [[10, 11, 11, 12], [3, 4, 3, 3]]
    assert out.num_leaves.tolist() == [2, 1]
    assert out.retrieve_paths[0].tolist() == [[0, 2, -1, -1], [0, 1, 3, -1]] + [[-1] * 4] * 2
    assert out.retrieve_paths[1].tolist() == [[0, 1, -1, -1]] + [[-1] * 4] * 3


# Tree sizes of the reference comparisons (also run by the CUDA kernel's emulation).
RAGGED_NODES = [1, 5, 32, 33, 70]
MEDUSA_NODES = [8, 26, 64]


def random_ragged_trees(batch, num_nodes, index_dtype, gen):
    """Random trees of 1..num_nodes nodes stacked into [batch, num_nodes] parents (-2 padded),
    random prefix lengths; returns (trees, parents, prefix_lens)."""
    trees = [tree_from_parents(random_parents(int(torch.randint(1, num_nodes + 1, (1,), generator=gen)), gen))
             for _ in range(batch)]
    _, parents = stack_trees(trees, num_nodes=num_nodes)
    prefix = torch.randint(0, 100, (batch,), generator=gen)
    return trees, parents.to(index_dtype), prefix.to(index_dtype)


def random_medusa_parents(num_nodes, gen):
    """Three Medusa-style trees (from random choices) of up to num_nodes nodes, stacked."""
    trees = [tree_from_choices(random_choices(num_nodes - 1 - k, gen)) for k in range(3)]
    return stack_trees(trees)[1]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("num_nodes", RAGGED_NODES)
def test_build_tree_masks_random_ragged(device, gen, index_dtype, num_nodes):
    batch = 5
    trees, parents, prefix = random_ragged_trees(batch, num_nodes, index_dtype, gen)
    parents, prefix = parents.to(device), prefix.to(device)
    got = ops.build_tree_masks(parents, prefix)
    assert_masks_equal(got, reference.build_tree_masks(parents, prefix))
    for b, tree in enumerate(trees):  # and against the host-side Tree
        n = len(tree)
        assert got.depth[b, :n].tolist() == tree.depths
        assert int(got.num_leaves[b]) == len(tree.leaves)
        for i, path in enumerate(tree.paths()):
            assert got.retrieve_paths[b, i, : len(path)].tolist() == path
            assert got.retrieve_paths[b, i, len(path):].eq(-1).all()


@pytest.mark.parametrize("num_nodes", MEDUSA_NODES)
def test_build_tree_masks_medusa_choices(device, gen, num_nodes):
    parents = random_medusa_parents(num_nodes, gen)
    prefix = torch.tensor([0, 17, 4096])
    got = ops.build_tree_masks(parents.to(device), prefix.to(device))
    assert_masks_equal(got, reference.build_tree_masks(parents, prefix))


def test_build_tree_masks_empty_request_and_sizes(device):
    parents = torch.tensor([[-2, -2, -2], [-1, 0, 1]], device=device)
    out = ops.build_tree_masks(parents, torch.tensor([4, 0], device=device))
    assert out.num_leaves.tolist() == [0, 1]
    assert out.mask[0].int().tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert out.retrieve_paths[0].eq(-1).all()
    assert out.retrieve_paths[1, 0].tolist() == [0, 1, 2]
    empty = ops.build_tree_masks(torch.zeros(2, 0, dtype=torch.int64, device=device),
                                 torch.tensor([1, 2], device=device))
    assert empty.mask.shape == (2, 0, 0) and empty.packed_mask.shape == (2, 0, 0)
    assert empty.num_leaves.tolist() == [0, 0]
    none = ops.build_tree_masks(torch.zeros(0, 4, dtype=torch.int64, device=device),
                                torch.zeros(0, dtype=torch.int64, device=device))
    assert none.mask.shape == (0, 4, 4)


BAD_MASK_ARGS = {
    "root not -1": ([[0, 0]], [0], "must be -1"),
    "second root": ([[-1, -1]], [0], "exactly one root"),
    "parent after child": ([[-1, 2, 0]], [0], "a parent comes before its child"),
    "self parent": ([[-1, 1]], [0], "a parent comes before its child"),
    "below -2": ([[-1, -5]], [0], "must be -2"),
    "padding parent": ([[-1, -2, 1]], [0], "names a padding node"),
    "empty request with nodes": ([[-2, 0]], [0], "as empty"),
    "negative prefix": ([[-1, 0]], [-1], "prefix_lens\\[0\\] = -1"),
    "prefix at the int64 maximum": ([[-1, 0]], [2**63 - 2], "leaves no room for the positions"),
    "prefix shape": ([[-1, 0]], [1, 2], "prefix_lens must have shape"),
    "parents 1-D": ([-1, 0], [1], "parents must have shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_MASK_ARGS))
def test_build_tree_masks_rejects(device, case):
    parents, prefix, message = BAD_MASK_ARGS[case]
    with pytest.raises(ValueError, match=message):
        ops.build_tree_masks(torch.tensor(parents, device=device), torch.tensor(prefix, device=device))


def test_build_tree_masks_rejects_dtypes(device):
    parents = torch.tensor([[-1, 0]], device=device)
    with pytest.raises(ValueError, match="int32 or int64"):
        ops.build_tree_masks(parents.float(), torch.tensor([0.0], device=device))
    with pytest.raises(ValueError, match="prefix_lens must have dtype"):
        ops.build_tree_masks(parents, torch.tensor([0], dtype=torch.int32, device=device))


def test_build_tree_masks_opcheck(device, gen):
    _, parents = stack_trees([tree_from_parents(random_parents(n, gen)) for n in (9, 4, 40)])
    torch.library.opcheck(
        torch.ops.specdec.build_tree_masks.default,
        (parents.to(device), torch.tensor([3, 0, 7], device=device)),
    )


# ----------------------------------------------------------------------------- HF-style 4-D masks


def dense_reference_mask(tree_mask, prefix_valid, window):
    """Brute force: positions counted over valid prefix columns, then tree depth."""
    batch, nodes, _ = tree_mask.shape
    past = prefix_valid.shape[1]
    out = torch.zeros(batch, 1, nodes, past + nodes, dtype=torch.bool)
    for b in range(batch):
        valid = prefix_valid[b].tolist()
        pos, key_pos = 0, []
        for v in valid:
            key_pos.append(pos)
            pos += int(v)
        depth = [int(tree_mask[b, j].sum()) - 1 for j in range(nodes)]
        for j in range(nodes):
            q_pos = pos + depth[j]
            for c in range(past):
                out[b, 0, j, c] = bool(valid[c]) and (window is None or q_pos - key_pos[c] < window)
            for k in range(nodes):
                out[b, 0, j, past + k] = bool(tree_mask[b, j, k]) and (
                    window is None or depth[j] - depth[k] < window)
    return out


@pytest.mark.parametrize("window", [None, 1, 3, 6])
def test_tree_attention_mask_4d(gen, window):
    _, parents = stack_trees([tree_from_parents(random_parents(n, gen)) for n in (7, 3, 5)])
    prefix_valid = torch.rand(3, 6, generator=gen) < 0.7  # holes anywhere (left/right padding)
    tree_mask = reference.build_tree_masks(parents, prefix_valid.sum(-1)).mask
    got = tree_attention_mask_4d(tree_mask, prefix_valid, sliding_window=window)
    assert got.shape == (3, 1, 7, 13) and got.dtype == torch.bool
    assert torch.equal(got, dense_reference_mask(tree_mask, prefix_valid, window))
    bias = tree_attention_bias_4d(tree_mask, prefix_valid.int(), torch.float16, sliding_window=window)
    assert bias.dtype == torch.float16
    assert torch.equal(bias == 0, got)
    assert bias[~got].eq(torch.finfo(torch.float16).min).all()


def test_tree_attention_mask_4d_right_padding_and_errors():
    lens = torch.tensor([2, 0])
    valid = prefix_valid_from_lens(lens, 3)
    assert valid.tolist() == [[True, True, False], [False, False, False]]
    tree_mask = torch.eye(2, dtype=torch.bool).expand(2, 2, 2)
    mask = tree_attention_mask_4d(tree_mask, valid)
    assert mask[0, 0].tolist() == [[True, True, False, True, False], [True, True, False, False, True]]
    with pytest.raises(ValueError, match="tree_mask must have shape"):
        tree_attention_mask_4d(tree_mask[0], valid)
    with pytest.raises(ValueError, match="prefix_valid must have shape"):
        tree_attention_mask_4d(tree_mask, valid[:1])
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        tree_attention_mask_4d(tree_mask, valid, sliding_window=0)
    with pytest.raises(ValueError, match="floating dtype"):
        tree_attention_bias_4d(tree_mask, valid, torch.int32)
