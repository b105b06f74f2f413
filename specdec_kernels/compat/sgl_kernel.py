"""sgl-kernel's speculative-decoding functions (EAGLE trees) on this package's CPU and CUDA ops.

Switch with one line: ``from specdec_kernels.compat.sgl_kernel import verify_tree_greedy,
tree_speculative_sampling_target_only, build_tree_kernel_efficient``. The functions take
sgl-kernel's arguments (by position or keyword, ``retrive_*`` or the ``retrieve_*`` spelling)
and write its outputs in place.

The tree format: per request ``b``, ``num_draft_tokens`` nodes; node 0 is the root (the last
verified token); ``retrive_next_token[b, i]`` is node ``i``'s first child and
``retrive_next_sibling[b, i]`` its next sibling (``-1``: none); ``candidates[b, i]`` is node
``i``'s token and ``retrive_index[b, i]`` its flat index into ``predicts`` (``b * N + i`` as
:func:`build_tree_kernel_efficient` makes it). Node numbers must put parents before children,
as ``build_tree_kernel_efficient`` does. Outputs: ``predicts[retrive_index[node]]`` is the token
that follows each node of the accepted path (the next accepted draft, and after the last node
the correction/bonus token); ``accept_index[b]`` lists the flat indices of the root and the
accepted nodes; ``accept_token_num[b]`` counts the accepted drafts. Entries past the path are
left as they were, as sgl-kernel leaves them.

Differences from sgl-kernel (also in the README):

- :func:`verify_tree_greedy` follows sgl-kernel's rule: at each node the *first* sibling (in
  ``retrive_next_sibling`` order) whose token equals the target's prediction is taken. This
  package's own greedy :func:`specdec_kernels.ops.verify_tree` takes the longest matching path
  instead, which differs only when siblings repeat a token; the adapter drops every repeated
  sibling after its first copy (and its subtree) before calling it.
- :func:`tree_speculative_sampling_target_only` supports the lossless mode only
  (``threshold_single == threshold_acc == 1``) and raises ``ValueError`` for sgl-kernel's lossy
  thresholds. Its randomness is this package's Philox stream keyed by the given coins: the same
  coins give the same result, and results follow the same (target) distribution as
  sgl-kernel's, but are not the same function of the coins. A sibling repeating a rejected
  token is rejected here (sgl-kernel's running sum would accept it with extra probability).
  ``draft_probs`` (sgl-kernel's zero-filled scratch) is neither read nor written.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.compat._common import log_probs, make_params
from specdec_kernels.tree import PAD_PARENT

__all__ = [
    "build_tree_kernel_efficient",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy",
]

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _pick(name: str, old: Optional[Tensor], new: Optional[Tensor]) -> Tensor:
    """One of the ``retrive_*`` / ``retrieve_*`` spellings of an argument."""
    if old is not None and new is not None:
        raise ValueError(f"pass retrive_{name} or retrieve_{name}, not both")
    if old is None and new is None:
        raise ValueError(f"missing argument retrive_{name}")
    return old if old is not None else new


def _check(t: Tensor, name: str, dtype: torch.dtype, dim: int) -> None:
    if t.dtype != dtype:
        raise ValueError(f"Expected '{name}' to be of type {dtype}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"'{name}' must have {dim} dimensions, got shape {tuple(t.shape)}")


def _follow_siblings(values: Tensor, next_sibling: Tensor, step) -> Tensor:
    """``values[next_sibling[m]] = step(values[m])`` along every sibling list, repeated
    ``N - 1`` times so that the longest list settles (each node has one predecessor)."""
    n = values.shape[1]
    target = torch.where(next_sibling >= 0, next_sibling, torch.full_like(next_sibling, n))
    for _ in range(max(n - 1, 0)):
        scratch = torch.cat([values, values[:, :1]], 1)  # column n absorbs "no sibling"
        values = scratch.scatter(1, target, step(values))[:, :n]
    return values


def _tree_arrays(next_token: Tensor, next_sibling: Tensor):
    """Parents (``-1`` root, ``-2`` unreachable), sibling ranks and depths of linked trees."""
    batch, n = next_token.shape
    device = next_token.device
    node = torch.arange(n, device=device).expand(batch, n)
    unknown = torch.full((batch, n + 1), PAD_PARENT, dtype=torch.int64, device=device)
    first = torch.where(next_token >= 0, next_token, torch.full_like(next_token, n))
    parents = unknown.scatter(1, first, node)[:, :n].clone()
    parents[:, 0] = -1
    ranks = unknown.scatter(1, first, torch.zeros_like(node))[:, :n].clone()
    ranks[:, 0] = 0
    # A sibling shares its predecessor's parent and ranks one after it.
    parents = _follow_siblings(parents, next_sibling, lambda v: v)
    ranks = _follow_siblings(ranks, next_sibling, lambda v: torch.where(v >= 0, v + 1, v))
    depth = torch.where(parents == -1, 0, -1)
    for _ in range(max(n - 1, 0)):
        up = depth.gather(1, parents.clamp(min=0))
        depth = torch.where((parents >= 0) & (up >= 0), up + 1, depth)
    return parents, ranks, depth


def _prune(parents: Tensor, dead: Tensor) -> Tensor:
    """Mark ``dead`` nodes and all their descendants as padding."""
    n = parents.shape[1]
    for _ in range(max(n - 1, 0)):
        dead = dead | ((parents >= 0) & dead.gather(1, parents.clamp(min=0)))
    return torch.where(dead, torch.full_like(parents, PAD_PARENT), parents)


def _parents_for(next_token, next_sibling, max_path, candidates=None):
    """Our parent array of sgl-kernel linked trees: nodes deeper than ``max_path - 1`` (never
    reached by the walk) removed; with ``candidates``, repeated sibling tokens after the first
    removed (the first-sibling rule)."""
    next_token, next_sibling = next_token.long(), next_sibling.long()
    parents, ranks, depth = _tree_arrays(next_token, next_sibling)
    dead = depth >= max_path
    if candidates is not None:
        same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & (parents.unsqueeze(2) >= 0)
        same &= candidates.unsqueeze(2) == candidates.unsqueeze(1)
        dead |= (same & (ranks.unsqueeze(1) < ranks.unsqueeze(2))).any(2)
    return _prune(parents, dead)


def _write_outputs(predicts, accept_index, accept_token_num, retrive_index, nodes, values, count):
    """In-place outputs for paths ``nodes`` (``[B, S]``: root then accepted nodes, -1 after)
    whose ``predicts`` entries are ``values`` (``[B, S]``); ``count`` accepted per request."""
    batch, steps = nodes.shape
    on_path = torch.arange(steps, device=nodes.device).unsqueeze(0) <= count.unsqueeze(1)
    flat = retrive_index.long().gather(1, nodes.clamp(min=0))
    # Positions past the path rewrite the root's entry with its own value (no masked writes).
    flat = torch.where(on_path, flat, flat[:, :1])
    values = torch.where(on_path, values, values[:, :1])
    predicts.index_put_((flat.flatten(),), values.flatten().to(predicts.dtype))
    accept_index.copy_(torch.where(on_path, flat.to(accept_index.dtype), accept_index))
    accept_token_num.copy_(count.to(accept_token_num.dtype))


def _path(accepted_nodes: Tensor, steps: int) -> Tensor:
    """``[B, steps]``: the root (0), then the accepted nodes, then -1."""
    batch = accepted_nodes.shape[0]
    path = torch.full((batch, steps), -1, dtype=torch.int64, device=accepted_nodes.device)
    path[:, 0] = 0
    m = min(steps - 1, accepted_nodes.shape[1])
    path[:, 1 : 1 + m] = accepted_nodes[:, :m]
    return path


def _check_common(predicts, accept_index, accept_token_num, candidates, links):
    _check(predicts, "predicts", torch.int32, 1)
    _check(accept_index, "accept_index", torch.int32, 2)
    _check(accept_token_num, "accept_token_num", torch.int32, 1)
    _check(candidates, "candidates", torch.int64, 2)
    batch, n = candidates.shape
    for name, t in links.items():
        _check(t, name, torch.int64, 2)
        if t.shape != candidates.shape:
            raise ValueError(f"{name} must be [{batch}, {n}] like candidates, got {tuple(t.shape)}")
    if accept_index.shape[0] != batch or accept_token_num.shape[0] != batch:
        raise ValueError(
            f"accept_index [{batch}, S] and accept_token_num [{batch}] expected, got "
            f"{tuple(accept_index.shape)} and {tuple(accept_token_num.shape)}"
        )
    if accept_index.shape[1] < 1:
        raise ValueError("accept_index needs at least one column (the root)")


def verify_tree_greedy(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Optional[Tensor] = None,
    retrive_next_token: Optional[Tensor] = None,
    retrive_next_sibling: Optional[Tensor] = None,
    target_predict: Optional[Tensor] = None,
    *,
    retrieve_index: Optional[Tensor] = None,
    retrieve_next_token: Optional[Tensor] = None,
    retrieve_next_sibling: Optional[Tensor] = None,
) -> None:
    """Greedy verification of EAGLE draft trees (sgl-kernel ``verify_tree_greedy``).

    From the root, repeatedly take the first child (in sibling order) whose token equals the
    target's prediction at the current node, at most ``S - 1`` times (``S =
    accept_index.shape[1]``).

    Parameters
    ----------
    predicts : Tensor
        ``[>= B * N]`` int32, written in place at the path's flat indices.
    accept_index : Tensor
        ``[B, S]`` int32, written in place (columns past the path untouched).
    accept_token_num : Tensor
        ``[B]`` int32, set to the accepted drafts per request.
    candidates : Tensor
        ``[B, N]`` int64 node tokens.
    retrive_index, retrive_next_token, retrive_next_sibling : Tensor
        ``[B, N]`` int64 tree links (also accepted as ``retrieve_*``).
    target_predict : Tensor
        ``[B, N]`` int64 target argmax at each node, read at flat index ``retrive_index``.

    Raises
    ------
    ValueError
        Wrong dtypes or shapes, or a malformed tree (a child numbered before its parent).
    """
    retrive_index = _pick("index", retrive_index, retrieve_index)
    next_token = _pick("next_token", retrive_next_token, retrieve_next_token)
    next_sibling = _pick("next_sibling", retrive_next_sibling, retrieve_next_sibling)
    if target_predict is None:
        raise ValueError("missing argument target_predict")
    _check_common(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        {
            "retrive_index": retrive_index,
            "retrive_next_token": next_token,
            "retrive_next_sibling": next_sibling,
            "target_predict": target_predict,
        },
    )
    batch, n = candidates.shape
    steps = accept_index.shape[1]
    parents = _parents_for(next_token, next_sibling, steps, candidates)
    predicted = target_predict.flatten().index_select(0, retrive_index.flatten()).view(batch, n)
    # Greedy on a two-token vocabulary: a node's token is 1 iff it equals its parent's
    # prediction, and every row's argmax is 1. With repeated siblings removed at most one
    # child matches, so the op's longest path is the sgl-kernel walk.
    match = candidates == predicted.gather(1, parents.clamp(min=0))
    logits = torch.tensor([float("-inf"), 0.0], device=candidates.device).expand(batch, n, 2)
    greedy = make_params(
        batch, candidates.device, torch.zeros(batch, dtype=torch.int64), temperature=0.0
    )
    accepted_nodes, _, count = ops.verify_tree(
        match.long(), parents, logits.contiguous(), None, greedy
    )
    nodes = _path(accepted_nodes, steps)
    values = predicted.gather(1, nodes.clamp(min=0))  # the prediction after each path node
    _write_outputs(predicts, accept_index, accept_token_num, retrive_index, nodes, values, count)


def _coin_seeds(uniform_samples: Tensor, final: Tensor) -> Tensor:
    """Per-request Philox seeds from the caller's coins (their float32 bits)."""
    first = uniform_samples[:, 0].float().contiguous().view(torch.int32).long() & 0x7FFFFFFF
    last = final.float().contiguous().view(torch.int32).long() & 0xFFFFFFFF
    return (first << 32) | last


def tree_speculative_sampling_target_only(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Optional[Tensor] = None,
    retrive_next_token: Optional[Tensor] = None,
    retrive_next_sibling: Optional[Tensor] = None,
    uniform_samples: Optional[Tensor] = None,
    uniform_samples_for_final_sampling: Optional[Tensor] = None,
    target_probs: Optional[Tensor] = None,
    draft_probs: Optional[Tensor] = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    *,
    retrieve_index: Optional[Tensor] = None,
    retrieve_next_token: Optional[Tensor] = None,
    retrieve_next_sibling: Optional[Tensor] = None,
) -> None:
    """Lossless tree speculative sampling from the target's probabilities only (one-hot
    drafts), sgl-kernel ``tree_speculative_sampling_target_only``, on
    :func:`specdec_kernels.ops.verify_tree`.

    At each node the children are tried in turn; a child with token ``x`` is accepted with the
    probability the target gives ``x`` among the tokens not yet rejected, and when every child
    is rejected the next token is drawn from the target with the rejected tokens removed. The
    emitted tokens follow the target distribution exactly.

    Parameters
    ----------
    predicts, accept_index, accept_token_num, candidates
        As in :func:`verify_tree_greedy`.
    retrive_index, retrive_next_token, retrive_next_sibling
        As in :func:`verify_tree_greedy`.
    uniform_samples : Tensor
        ``[B, N]`` float32 coins; with ``uniform_samples_for_final_sampling`` (``[B]``) they
        seed this package's random stream (same coins, same result).
    target_probs : Tensor
        ``[B, N, V]`` (or ``[B * N, V]``) float32 target probabilities at each node.
    draft_probs : Tensor, optional
        sgl-kernel's zero-filled scratch; ignored.
    threshold_single, threshold_acc : float
        Must be 1.0 (lossless). sgl-kernel's lossy acceptance below 1 is not supported.
    deterministic : bool
        Ignored (always deterministic).

    Raises
    ------
    ValueError
        Thresholds other than 1, wrong dtypes or shapes, a malformed tree, or probabilities
        that are not a distribution.
    """
    if float(threshold_single) != 1.0 or float(threshold_acc) != 1.0:
        raise ValueError(
            "tree_speculative_sampling_target_only: only the lossless mode is supported "
            f"(threshold_single = threshold_acc = 1.0), got threshold_single={threshold_single}, "
            f"threshold_acc={threshold_acc}; thresholds below 1 accept drafts the target "
            "distribution would reject"
        )
    retrive_index = _pick("index", retrive_index, retrieve_index)
    next_token = _pick("next_token", retrive_next_token, retrieve_next_token)
    next_sibling = _pick("next_sibling", retrive_next_sibling, retrieve_next_sibling)
    for name, t in (
        ("uniform_samples", uniform_samples),
        ("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling),
        ("target_probs", target_probs),
    ):
        if t is None:
            raise ValueError(f"missing argument {name}")
    _check_common(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        {
            "retrive_index": retrive_index,
            "retrive_next_token": next_token,
            "retrive_next_sibling": next_sibling,
        },
    )
    batch, n = candidates.shape
    if target_probs.numel() == 0 or target_probs.shape[:-1].numel() != batch * n:
        raise ValueError(
            f"target_probs must be [{batch}, {n}, V] or [{batch * n}, V], "
            f"got {tuple(target_probs.shape)}"
        )
    if tuple(uniform_samples.shape) != (batch, n) or tuple(
        uniform_samples_for_final_sampling.shape
    ) != (batch,):
        raise ValueError(
            f"uniform_samples [{batch}, {n}] and uniform_samples_for_final_sampling [{batch}] "
            f"expected, got {tuple(uniform_samples.shape)} and "
            f"{tuple(uniform_samples_for_final_sampling.shape)}"
        )
    steps = accept_index.shape[1]
    parents = _parents_for(next_token, next_sibling, steps)
    logits, valid = log_probs(target_probs.reshape(batch, n, -1))
    seeds = _coin_seeds(uniform_samples, uniform_samples_for_final_sampling)
    params = make_params(batch, candidates.device, seeds)
    accepted_nodes, tokens, count = ops.verify_tree(candidates, parents, logits, None, params)
    nodes = _path(accepted_nodes, steps)
    values = _path_tokens(tokens, steps)
    _write_outputs(predicts, accept_index, accept_token_num, retrive_index, nodes, values, count)


def _path_tokens(tokens: Tensor, steps: int) -> Tensor:
    """``[B, steps]``: the op's tokens (accepted drafts then the next token), -1 padded."""
    batch = tokens.shape[0]
    out = torch.full((batch, steps), -1, dtype=torch.int64, device=tokens.device)
    m = min(steps, tokens.shape[1])
    out[:, :m] = tokens[:, :m]
    return out


def _parents_from_selection(parent_list: Tensor, selected_index: Tensor, topk: int) -> Tensor:
    """EAGLE's tree as a parent array: node ``i > 0`` is draft ``selected_index[i - 1]``; its
    parent is the root when that draft came from the root's top-k, else the node that holds
    the draft ``parent_list[selected_index[i - 1] // topk]``."""
    batch, m = selected_index.shape
    device = selected_index.device
    selected = selected_index.long()
    source = selected // topk
    parent_token = parent_list.long().gather(1, source.clamp(max=max(parent_list.shape[1] - 1, 0)))
    match = selected.unsqueeze(1) == parent_token.unsqueeze(2)  # [B, m (child), m (candidate)]
    found = match.any(2)
    position = match.long().argmax(2) + 1
    parents = torch.where(source == 0, torch.zeros_like(position), position)
    missing = (source != 0) & ~found
    if bool(missing.any()):
        b, i = missing.nonzero()[0].tolist()
        raise ValueError(
            f"invalid EAGLE tree: draft {i + 1} of request {b} has no selected parent "
            f"(selected_index {selected_index[b].tolist()}); check the draft log-probs for NaN"
        )
    root = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return torch.cat([root, parents], 1)


def build_tree_kernel_efficient(
    parent_list: Tensor,
    selected_index: Tensor,
    verified_seq_len: Tensor,
    tree_mask: Tensor,
    positions: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int = FULL_MASK,
) -> None:
    """EAGLE's draft tree: attention mask, positions and retrieve links, in place
    (sgl-kernel ``build_tree_kernel_efficient``), from :func:`specdec_kernels.ops.build_tree_masks`.

    Parameters
    ----------
    parent_list : Tensor
        ``[B, topk * (depth - 1) + 1]`` int64: the flat draft index each top-k expansion came
        from.
    selected_index : Tensor
        ``[B, draft_token_num - 1]`` int64 selected draft indices, sorted.
    verified_seq_len : Tensor
        ``[B]`` int64 committed lengths (the root's position).
    tree_mask : Tensor
        Written in place. ``FULL_MASK`` (0): bool, per request ``N`` rows of
        ``verified_seq_len[b] + N`` columns, flattened and concatenated; only the tree columns
        are written (the prefix columns keep the caller's ``True``). ``QLEN_ONLY`` (1): bool
        ``[B * N * N]``. ``QLEN_ONLY_BITPACKING`` (2): ``[B * N]`` of uint8/uint16/uint32
        (N <= 8/16/32), bit ``k`` of row ``j`` set iff node ``k`` is ``j`` or an ancestor.
    positions : Tensor
        ``[B * N]`` int64: ``verified_seq_len[b] + depth``.
    retrive_index, retrive_next_token, retrive_next_sibling : Tensor
        ``[B, N]`` int64: ``b * N + i``, first child and next sibling (children in node
        order), ``-1`` for none.
    topk, depth : int
        EAGLE's branching and number of draft steps.
    draft_token_num : int
        ``N``: nodes per tree, the root included.
    tree_mask_mode : int
        0, 1 or 2 as above.

    Raises
    ------
    ValueError
        Shapes that disagree with ``draft_token_num``, an unknown mode, more than 32 nodes in
        bit-packed mode, or a draft whose parent was not selected.
    """
    n = int(draft_token_num)
    batch = selected_index.shape[0]
    if tuple(selected_index.shape) != (batch, n - 1):
        raise ValueError(f"selected_index must be [B, {n - 1}], got {tuple(selected_index.shape)}")
    for name, t in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ):
        if tuple(t.shape) != (batch, n):
            raise ValueError(f"{name} must be [{batch}, {n}], got {tuple(t.shape)}")
    if positions.numel() != batch * n:
        raise ValueError(f"positions must hold {batch * n} values, got {positions.numel()}")
    device = selected_index.device
    parents = _parents_from_selection(parent_list, selected_index, int(topk))
    masks = ops.build_tree_masks(parents, verified_seq_len.long())
    positions.copy_(masks.position_ids.reshape(positions.shape).to(positions.dtype))

    node = torch.arange(n, device=device).expand(batch, n)
    retrive_index.copy_(torch.arange(batch * n, device=device).view(batch, n))
    # Children in node order: a node's first child is its smallest; a child's next sibling is
    # the next larger child of the same parent.
    same_parent = parents.unsqueeze(2) == parents.unsqueeze(1)  # [B, i, j]
    later = node.unsqueeze(2) < node.unsqueeze(1)
    sibling = torch.where(same_parent & later, node.unsqueeze(1), n).min(2).values
    child = (
        torch.where(parents.unsqueeze(1) == node.unsqueeze(2), node.unsqueeze(1), n).min(2).values
    )
    retrive_next_sibling.copy_(torch.where(sibling < n, sibling, -1))
    retrive_next_token.copy_(torch.where(child < n, child, -1))

    mode = int(tree_mask_mode)
    if mode == QLEN_ONLY:
        if tree_mask.numel() != batch * n * n:
            raise ValueError(
                f"QLEN_ONLY tree_mask must hold {batch * n * n} values, got {tree_mask.numel()}"
            )
        tree_mask.copy_(masks.mask.reshape(tree_mask.shape))
    elif mode == QLEN_ONLY_BITPACKING:
        if n > 32:
            raise ValueError(f"bit-packed tree masks hold at most 32 nodes, got {n}")
        nbytes = tree_mask.element_size()
        if tree_mask.numel() != batch * n or nbytes * 8 < n:
            raise ValueError(
                f"QLEN_ONLY_BITPACKING tree_mask must be [{batch * n}] with at least {n} bits per "
                f"row, got {tuple(tree_mask.shape)} of {tree_mask.dtype}"
            )
        packed = masks.packed_mask[..., 0].contiguous().view(torch.uint8).view(batch * n, 4)
        tree_mask.view(torch.uint8).view(batch * n, nbytes).copy_(packed[:, :nbytes])
    elif mode == FULL_MASK:
        lens = verified_seq_len.long()
        starts = torch.cumsum(lens * n + n * n, 0) - (lens * n + n * n)
        rows = node.unsqueeze(2)  # [B, N, 1]
        cols = node.unsqueeze(1)  # [B, 1, N]
        flat = (
            starts.view(batch, 1, 1)
            + (lens.view(batch, 1, 1) + n) * rows
            + lens.view(batch, 1, 1)
            + cols
        )
        tree_mask.view(-1).index_put_((flat.flatten(),), masks.mask.flatten())
    else:
        raise ValueError(
            f"unknown tree_mask_mode {tree_mask_mode} (0 full, 1 qlen only, 2 bit-packed)"
        )
