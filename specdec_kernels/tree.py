"""Draft trees for tree-structured speculative decoding (Medusa, EAGLE, SpecInfer, lookahead).

A draft tree is a set of candidate continuations that share prefixes. Node 0 is the root: the
last accepted token, whose K/V is not in the cache yet. Every other node is one drafted token;
its parent is the token before it. Nodes are numbered so that a parent always comes before its
children, which lets every kernel walk a tree in one pass.

This module builds trees on the host, from

- a parent array (:func:`tree_from_parents`),
- a Medusa-style list of top-k rank paths (:func:`tree_from_choices`),
- several drafters' token sequences merged by common prefix (:func:`tree_from_sequences`,
  or token by token in a :class:`Trie`),

checks them (:class:`ValueError` with the offending node on any malformed input) and stacks a
batch of ragged trees into padded tensors for the ops (:func:`stack_trees`). The 4-D masks that
Hugging Face models take are :mod:`specdec_kernels.models.hf_masks`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_NODES",
    "PAD_PARENT",
    "Tree",
    "Trie",
    "pack_tree_mask",
    "sequence_nodes",
    "stack_trees",
    "tree_from_choices",
    "tree_from_parents",
    "tree_from_sequences",
    "unpack_tree_mask",
]

#: Parent value that marks an unused (padding) node of a ragged tree in a batch.
PAD_PARENT = -2
#: Default limit on the number of nodes (root included); pass ``max_nodes`` to change it.
DEFAULT_MAX_NODES = 2048
#: Default limit on a tree's depth (the root has depth 0); pass ``max_depth`` to change it.
DEFAULT_MAX_DEPTH = 256


def _as_int_list(values: Iterable, name: str) -> list[int]:
    """Plain Python ints from a sequence or 1-D tensor, rejecting floats and bools."""
    if isinstance(values, Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}")
        if values.is_floating_point() or values.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {values.dtype}")
        return [int(v) for v in values.tolist()]
    out = []
    for i, v in enumerate(values):
        if isinstance(v, Tensor) and v.dim() == 0 and not v.is_floating_point() and v.dtype != torch.bool:
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"{name}[{i}] must be an int, got {v!r}")
        out.append(int(v))
    return out


def _cycle_through(parents: list[int], start: int) -> list[int] | None:
    """The cycle reached by following parents from ``start``, or None if the walk ends at -1."""
    order: dict[int, int] = {}
    node = start
    while node >= 0 and node not in order:
        order[node] = len(order)
        node = parents[node]
    if node < 0:
        return None
    walk = list(order)
    return walk[order[node] :]


def _validate_parents(parents: list[int], max_nodes: int, max_depth: int) -> list[int]:
    """Check a parent array and return the depth of every node."""
    n = len(parents)
    if n == 0:
        raise ValueError("a tree needs at least its root: parents must not be empty")
    if n > max_nodes:
        raise ValueError(f"the tree has {n} nodes, more than max_nodes={max_nodes}")
    roots = [i for i, p in enumerate(parents) if p == -1]
    if len(roots) != 1:
        raise ValueError(
            f"a tree has exactly one root (parent -1), found {len(roots)} at nodes {roots[:8]}"
        )
    if roots[0] != 0:
        raise ValueError(f"the root must be node 0, but node {roots[0]} has parent -1")
    for i in range(1, n):
        p = parents[i]
        if p < 0 or p >= n:
            raise ValueError(
                f"parents[{i}] = {p} is not a node index (must be in [0, {n}); -1 only at the root)"
            )
    depths = [0] * n
    for i in range(1, n):
        p = parents[i]
        if p >= i:
            cycle = _cycle_through(parents, i)
            if cycle is not None:
                raise ValueError(f"parents form a cycle through nodes {cycle}")
            raise ValueError(
                f"parents[{i}] = {p}: a parent must come before its child "
                "(number the nodes in breadth- or depth-first order)"
            )
        depths[i] = depths[p] + 1
        if depths[i] > max_depth:
            raise ValueError(f"node {i} has depth {depths[i]}, more than max_depth={max_depth}")
    return depths


@dataclass
class Tree:
    """A draft tree: node 0 is the root, every other node's parent comes before it.

    Construct with :func:`tree_from_parents`, :func:`tree_from_choices` or
    :func:`tree_from_sequences`; the constructor validates too.

    Attributes
    ----------
    parents : list of int
        ``parents[0] = -1``; ``0 <= parents[j] < j`` for every other node ``j``.
    tokens : list of int or None
        The token of every node (node 0: the root token), or None for a tree of shape only.
    ranks : list of int or None
        For trees built from Medusa choices: the top-k rank each node's token is taken from
        (``-1`` at the root); the token of node ``j`` is rank ``ranks[j]`` of the prediction
        for depth ``depths[j]``.
    """

    parents: list[int]
    tokens: list[int] | None = None
    ranks: list[int] | None = None

    def __post_init__(self):
        self.parents = _as_int_list(self.parents, "parents")
        self._depths = _validate_parents(self.parents, len(self.parents), len(self.parents))
        if self.tokens is not None:
            self.tokens = _check_tokens(self.tokens, len(self.parents))
        if self.ranks is not None:
            self.ranks = _as_int_list(self.ranks, "ranks")
            if len(self.ranks) != len(self.parents):
                raise ValueError(f"ranks has {len(self.ranks)} entries for {len(self.parents)} nodes")

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        """Depth of every node (the root has depth 0)."""
        return list(self._depths)

    @property
    def depth(self) -> int:
        """Depth of the deepest node."""
        return max(self._depths)

    @cached_property
    def children(self) -> list[list[int]]:
        """Children of every node, in increasing node order."""
        kids: list[list[int]] = [[] for _ in self.parents]
        for j, p in enumerate(self.parents[1:], start=1):
            kids[p].append(j)
        return kids

    @property
    def leaves(self) -> list[int]:
        """Nodes without children, in increasing node order (the same order as the
        ``retrieve_paths`` of :func:`specdec_kernels.ops.build_tree_masks`)."""
        return [j for j, kids in enumerate(self.children) if not kids]

    def path(self, node: int) -> list[int]:
        """Nodes from the root to ``node``, both included."""
        if not 0 <= node < len(self.parents):
            raise ValueError(f"node {node} is not in a tree of {len(self.parents)} nodes")
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def paths(self) -> list[list[int]]:
        """Root-to-leaf paths, one per leaf in :attr:`leaves` order."""
        return [self.path(leaf) for leaf in self.leaves]

    @property
    def choices(self) -> list[tuple[int, ...]]:
        """The rank path of every node after the root, in node order (trees with
        :attr:`ranks`, e.g. from :func:`tree_from_choices`, of which this is the inverse)."""
        if self.ranks is None:
            raise ValueError("the tree has no ranks: build it with tree_from_choices")
        paths: list[tuple[int, ...]] = [()]
        for j in range(1, len(self.parents)):
            paths.append(paths[self.parents[j]] + (self.ranks[j],))
        return paths[1:]

    def with_tokens(self, tokens: Sequence[int] | Tensor) -> "Tree":
        """The same tree shape carrying ``tokens`` (one per node, the root's first)."""
        return Tree(list(self.parents), tokens=_check_tokens(tokens, len(self.parents)),
                    ranks=None if self.ranks is None else list(self.ranks))


def _check_tokens(tokens, num_nodes: int) -> list[int]:
    tokens = _as_int_list(tokens, "tokens")
    if len(tokens) != num_nodes:
        raise ValueError(f"tokens has {len(tokens)} entries for {num_nodes} nodes")
    negative = [i for i, t in enumerate(tokens) if t < 0]
    if negative:
        raise ValueError(f"tokens must be non-negative ids, tokens[{negative[0]}] = {tokens[negative[0]]}")
    return tokens


def tree_from_parents(
    parents: Sequence[int] | Tensor,
    tokens: Sequence[int] | Tensor | None = None,
    *,
    max_nodes: int = DEFAULT_MAX_NODES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Tree:
    """A tree from its parent array.

    Parameters
    ----------
    parents : sequence of int or 1-D Tensor
        ``parents[0] = -1`` (the root); for every other node ``j``, ``0 <= parents[j] < j``.
    tokens : sequence of int or 1-D Tensor, optional
        One non-negative token id per node.
    max_nodes, max_depth : int
        Limits; a larger tree is rejected.

    Returns
    -------
    Tree

    Raises
    ------
    ValueError
        No root, several roots, a root other than node 0, a parent index out of range or not
        before its child, a cycle, a tree over the limits, or tokens of the wrong length.
    """
    parents = _as_int_list(parents, "parents")
    _validate_parents(parents, max_nodes, max_depth)
    return Tree(parents, tokens=None if tokens is None else list(_as_int_list(tokens, "tokens")))


def tree_from_choices(
    choices: Sequence[Sequence[int]],
    *,
    max_nodes: int = DEFAULT_MAX_NODES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Tree:
    """A tree from a Medusa-style choice list.

    Each choice is the path of top-k ranks from the root to one node: ``[0]`` is the top-1
    prediction of the first head, ``[0, 1]`` the top-2 prediction of the second head after it.
    Nodes are numbered by (depth, path), the order Medusa uses, so node ``i + 1`` is the
    ``i``-th choice of ``sorted(choices, key=lambda c: (len(c), c))``.

    Parameters
    ----------
    choices : sequence of sequence of int
        Non-empty rank paths, each rank >= 0; every proper prefix of a path must be a choice too.
        An empty list gives a tree of the root alone.
    max_nodes, max_depth : int
        Limits; a larger tree is rejected.

    Returns
    -------
    Tree
        With :attr:`Tree.ranks` set (the last rank of each node's path; -1 at the root).

    Raises
    ------
    ValueError
        An empty or negative path, a duplicate, a path whose prefix is missing, or a tree
        over the limits.
    """
    paths: list[tuple[int, ...]] = []
    for i, choice in enumerate(choices):
        path = tuple(_as_int_list(choice, f"choices[{i}]"))
        if not path:
            raise ValueError(f"choices[{i}] is empty; the root is implicit")
        if min(path) < 0:
            raise ValueError(f"choices[{i}] = {list(path)} has a negative rank")
        paths.append(path)
    ordered = sorted(paths, key=lambda p: (len(p), p))
    node_of: dict[tuple[int, ...], int] = {(): 0}
    parents, ranks = [-1], [-1]
    for path in ordered:
        if path in node_of:
            raise ValueError(f"choice {list(path)} appears more than once")
        if path[:-1] not in node_of:
            raise ValueError(
                f"choice {list(path)} has no parent: the list lacks its parent {list(path[:-1])}"
            )
        node_of[path] = len(parents)
        parents.append(node_of[path[:-1]])
        ranks.append(path[-1])
    _validate_parents(parents, max_nodes, max_depth)
    return Tree(parents, ranks=ranks)


def tree_from_sequences(
    sequences: Sequence[Sequence[int]],
    root_token: int,
    *,
    max_nodes: int = DEFAULT_MAX_NODES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Tree:
    """Merge token sequences that continue ``root_token`` into one tree by common prefix.

    This is how several drafters' proposals (or lookahead n-grams) become one tree to verify:
    equal prefixes share nodes, so each distinct continuation is scored once. Nodes are
    numbered in order of first appearance, so every sequence's nodes come before those of the
    sequences after it that branch off it.

    Parameters
    ----------
    sequences : sequence of sequence of int
        Drafted tokens after the root (the root token not included). Empty sequences and
        duplicates are allowed and add nothing.
    root_token : int
        The token of node 0.
    max_nodes, max_depth : int
        Limits; a larger merged tree is rejected.

    Returns
    -------
    Tree
        With tokens; use :func:`sequence_nodes` to find the nodes of one sequence.

    Raises
    ------
    ValueError
        A negative token, or a merged tree over the limits.
    """
    (root_token,) = _as_int_list([root_token], "root_token")
    trie = Trie(root_token)
    for i, sequence in enumerate(sequences):
        sequence = _as_int_list(sequence, f"sequences[{i}]")
        if len(sequence) > max_depth:
            raise ValueError(
                f"sequences[{i}] has {len(sequence)} tokens, more than max_depth={max_depth}"
            )
        node = 0
        for token in sequence:
            if token < 0:
                raise ValueError(f"sequences[{i}] holds a negative token {token}")
            if trie.child(node, token) is None and len(trie) >= max_nodes:
                raise ValueError(f"the merged tree exceeds max_nodes={max_nodes}")
            node = trie.add(node, token)
    return trie.tree()


class Trie:
    """A tree of tokens that grows one node at a time, merging by common prefix: the child of a
    node for a token is made once, so a continuation added twice (by two drafters, or twice by
    one) is one node. Nodes are numbered in order of creation, parents first.

    Parameters
    ----------
    root_token : int
        The token of node 0.

    Attributes
    ----------
    tokens, parents, depths : list of int
        Per node (node 0 the root: parent ``-1``, depth 0).
    """

    def __init__(self, root_token: int):
        self.tokens, self.parents, self.depths = [int(root_token)], [-1], [0]
        self._children: list[dict] = [{}]

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int) -> int:
        """The child of ``parent`` for ``token``, made if new."""
        node = self._children[parent].get(token)
        if node is None:
            node = len(self.tokens)
            self._children[parent][token] = node
            self.tokens.append(int(token))
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self._children.append({})
        return node

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` for ``token``, or None."""
        return self._children[node].get(token)

    def children(self, node: int) -> dict:
        """``{token: node}`` of ``node``'s children, in order of creation."""
        return self._children[node]

    def follow(self, tokens: Sequence[int]) -> list[int]:
        """The nodes (after the root) that spell the longest prefix of ``tokens`` the trie
        holds."""
        path, node = [], 0
        for token in tokens:
            node = self._children[node].get(token)
            if node is None:
                break
            path.append(node)
        return path

    def tree(self, nodes: Sequence[int] | None = None) -> Tree:
        """The trie as a :class:`Tree` with tokens, or only ``nodes`` (increasing, the root
        first, every node's parent among them), renumbered in that order."""
        if nodes is None:
            return Tree(list(self.parents), tokens=list(self.tokens))
        index = {node: i for i, node in enumerate(nodes)}
        return Tree(
            parents=[-1] + [index[self.parents[n]] for n in nodes[1:]],
            tokens=[self.tokens[n] for n in nodes],
        )


def sequence_nodes(tree: Tree, sequence: Sequence[int]) -> list[int]:
    """The nodes (after the root) whose tokens spell ``sequence`` from the root.

    Parameters
    ----------
    tree : Tree
        A tree with tokens.
    sequence : sequence of int
        Tokens after the root.

    Returns
    -------
    list of int
        One node per token of ``sequence``.

    Raises
    ------
    ValueError
        The tree has no tokens, or the sequence is not a path of the tree.
    """
    if tree.tokens is None:
        raise ValueError("the tree has no tokens")
    node, out = 0, []
    for i, token in enumerate(_as_int_list(sequence, "sequence")):
        nxt = [c for c in tree.children[node] if tree.tokens[c] == token]
        if not nxt:
            raise ValueError(f"token {i} ({token}) of the sequence does not continue node {node}")
        node = nxt[0]
        out.append(node)
    return out


def stack_trees(
    trees: Sequence[Tree],
    *,
    num_nodes: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Stack ragged trees into padded ``[B, T]`` tensors for the ops.

    Parameters
    ----------
    trees : sequence of Tree
        One tree per request.
    num_nodes : int, optional
        ``T``; defaults to the largest tree's size. A fixed value keeps shapes static (CUDA
        graphs, ``torch.compile``).
    device : torch.device or str, optional
        Where to put the tensors (default CPU).

    Returns
    -------
    tokens : Tensor
        ``[B, T]`` int64, each tree's tokens (0 for trees without tokens and for padding).
    parents : Tensor
        ``[B, T]`` int64, each tree's parents, :data:`PAD_PARENT` (``-2``) for padding nodes.

    Raises
    ------
    ValueError
        No trees, or ``num_nodes`` smaller than a tree.
    """
    if len(trees) == 0:
        raise ValueError("stack_trees needs at least one tree")
    largest = max(len(t) for t in trees)
    if num_nodes is None:
        num_nodes = largest
    if num_nodes < largest:
        raise ValueError(f"num_nodes={num_nodes} is smaller than the largest tree ({largest} nodes)")
    tokens = torch.zeros(len(trees), num_nodes, dtype=torch.int64)
    parents = torch.full((len(trees), num_nodes), PAD_PARENT, dtype=torch.int64)
    for b, tree in enumerate(trees):
        parents[b, : len(tree)] = torch.tensor(tree.parents, dtype=torch.int64)
        if tree.tokens is not None:
            tokens[b, : len(tree)] = torch.tensor(tree.tokens, dtype=torch.int64)
    return tokens.to(device), parents.to(device)


def pack_tree_mask(mask: Tensor) -> Tensor:
    """Bit-pack a boolean tree mask the way the ops expect.

    Parameters
    ----------
    mask : Tensor
        ``[..., T]`` bool.

    Returns
    -------
    Tensor
        ``[..., ceil(T / 32)]`` int32; bit ``k % 32`` of word ``k // 32`` is ``mask[..., k]``.
    """
    num = mask.shape[-1]
    words = -(-num // 32)
    padded = torch.zeros(*mask.shape[:-1], words * 32, dtype=torch.int64, device=mask.device)
    padded[..., :num] = mask.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=mask.device) << torch.arange(
        32, device=mask.device
    )
    packed = (padded.view(*mask.shape[:-1], words, 32) * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_tree_mask(packed: Tensor, num_nodes: int) -> Tensor:
    """Inverse of :func:`pack_tree_mask`: ``[..., W]`` int32 to ``[..., num_nodes]`` bool."""
    bits = torch.arange(32, device=packed.device, dtype=torch.int64)
    words = packed.to(torch.int64) & 0xFFFFFFFF
    unpacked = ((words[..., None] >> bits) & 1).bool()
    return unpacked.flatten(-2)[..., :num_nodes]
