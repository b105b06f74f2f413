"""Typed wrappers of the verification ops (``csrc/verify.cpp``, ``csrc/cuda/verify_*.cu``): decide,
from the target's logits, which drafts of a chain or a tree to accept (lossless rejection
sampling, or Medusa's typical acceptance) and which token comes next.

Processing, random streams and errors are those of :mod:`specdec_kernels.ops.sampling`. Each
wrapper's fake (meta) kernel is registered right after it; the executable specification is the
function of the same name in :mod:`specdec_kernels.reference`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from specdec_kernels.ops.sampling import offsets_or_zeros
from specdec_kernels.sampling import SamplingParams

__all__ = ["typical_verify_chain", "typical_verify_tree", "verify_chain", "verify_tree"]


def _int64(t: Tensor) -> Tensor:
    return t if t.dtype == torch.int64 else t.long()


def _num_draft_or_all(num_draft: Optional[Tensor], draft_tokens: Tensor) -> Tensor:
    """``num_draft`` as int64, or every column of ``draft_tokens`` for each request."""
    if num_draft is None:
        batch, k = draft_tokens.shape
        return torch.full((batch,), k, dtype=torch.int64, device=draft_tokens.device)
    return _int64(num_draft)


def _chain_outputs_fake(draft_tokens):
    batch, k = draft_tokens.shape
    return (
        draft_tokens.new_empty((batch, k + 1), dtype=torch.int64),
        draft_tokens.new_empty((batch,), dtype=torch.int64),
    )


def _tree_outputs_fake(tree_tokens):
    batch, nodes = tree_tokens.shape
    return (
        tree_tokens.new_empty((batch, nodes), dtype=torch.int64),
        tree_tokens.new_empty((batch, nodes), dtype=torch.int64),
        tree_tokens.new_empty((batch,), dtype=torch.int64),
    )


def verify_chain(
    draft_tokens: Tensor,
    num_draft: Optional[Tensor],
    target_logits: Tensor,
    draft_probs: Optional[Tensor],
    params: SamplingParams,
    offset: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Verify a chain of drafts per request against the target's logits, in one launch.

    Greedy requests (temperature 0) accept drafts while each equals the target argmax, then
    emit the argmax at the first mismatch (or after the last draft). Sampling requests use
    lossless rejection sampling on the processed target distribution p_i of row i: draft x_i
    (drafted from q_i) is accepted iff ``q_i(x_i) > 0 and u * q_i(x_i) < p_i(x_i)``; at the first
    rejection the next token is drawn from ``normalize(max(0, p_i - q_i))`` (from p_i if that is
    all zero); if every draft is accepted a bonus token is drawn from p_K. The emitted tokens
    are distributed exactly as the target's own samples. Greedy and sampling requests may
    share a batch; rows past ``num_draft[b]`` are never read.

    Parameters
    ----------
    draft_tokens : Tensor
        ``[B, K]`` int64 (int32 is converted) draft ids; columns ``>= num_draft[b]`` are ignored.
    num_draft : Tensor, optional
        ``[B]`` number of valid drafts per request, in ``[0, K]``; ``K`` for all if omitted.
    target_logits : Tensor
        ``[B, K+1, V]`` float32/float16/bfloat16: row i is the target's output at the position
        whose next token is draft i (row K: after the last draft).
    draft_probs : Tensor, optional
        ``[B, K, V]`` float32: the distribution each draft was sampled from (e.g. from
        :func:`sample_with_probs`). ``None`` for deterministic drafters (n-gram, lookup): q is
        one-hot at the draft. Only the drafted token's entry is validated (in ``[0, 1]``); the
        rest is trusted to be a distribution (a NaN entry gives its token no residual mass).
    params : SamplingParams
        ``[B]`` per-request parameters, applied to the target logits (and assumed to be what
        produced ``draft_probs``).
    offset : Tensor, optional
        ``[B]`` int64 Philox counter per request; zeros if omitted. Advance it every step (e.g.
        by the tokens emitted) so steps draw fresh uniforms.

    Returns
    -------
    tokens : Tensor
        ``[B, K+1]`` int64: ``tokens[b, :num_accepted[b] + 1]`` are the accepted drafts then the
        correction or bonus token; the rest is -1.
    num_accepted : Tensor
        ``[B]`` int64 accepted drafts, in ``[0, num_draft[b]]``.

    Raises
    ------
    ValueError
        Shapes/dtypes/devices, or per-request value errors (see
        :mod:`specdec_kernels.ops.sampling`).

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> target_logits = torch.tensor([[[0.0, 3.0, 1.0],  # row 0 (after the last accepted token)
    ...                                [2.0, 0.0, 1.0],  # row 1 (after draft 0)
    ...                                [0.0, 0.0, 5.0]]])  # row 2 (after draft 1)
    >>> drafts = torch.tensor([[1, 2]])
    >>> params = SamplingParams.create(1)  # greedy
    >>> tokens, num_accepted = ops.verify_chain(drafts, None, target_logits, None, params)
    >>> num_accepted  # greedy: draft 0 is row 0's argmax, draft 1 is not row 1's
    tensor([1])
    >>> tokens  # the accepted draft, then row 1's argmax
    tensor([[ 1,  0, -1]])
    """
    return torch.ops.specdec.verify_chain(
        _int64(draft_tokens),
        _num_draft_or_all(num_draft, draft_tokens),
        target_logits,
        draft_probs,
        *params.tensors(),
        offsets_or_zeros(offset, draft_tokens.shape[0], target_logits.device),
    )


@torch.library.register_fake("specdec::verify_chain")
def _verify_chain_fake(draft_tokens, num_draft, target_logits, draft_probs, *params):
    return _chain_outputs_fake(draft_tokens)


def verify_tree(
    tree_tokens: Tensor,
    parents: Tensor,
    target_logits: Tensor,
    draft_probs: Optional[Tensor],
    params: SamplingParams,
    offset: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Verify a tree of drafts per request against the target's logits, in one launch.

    Greedy requests take the longest root-to-node path whose every token equals its parent's
    argmax (ties between equally long paths: the lowest final node index) and emit the argmax
    after it. Sampling requests use recursive rejection sampling (SpecInfer): at the current
    node the children are tried in index order against the current distribution v (first the
    node's processed target p); child c with token x is accepted iff
    ``q_c(x) > 0 and u * q_c(x) < v(x)``, and after a rejection v becomes
    ``normalize(max(0, v - q_c))`` (one-hot q_c when ``draft_probs`` is None: x's mass is
    removed). The first accepted child becomes the current node; when none is, the next token is
    drawn from v. Lossless for drafts drawn independently from their q (or fixed drafts).

    Parameters
    ----------
    tree_tokens : Tensor
        ``[B, T]`` int64 token of every node; node 0 is the root (the last accepted token,
        already emitted; its token is not read).
    parents : Tensor
        ``[B, T]`` int64 parent index of every node: ``-1`` at node 0, smaller than the node's
        own index elsewhere, ``-2`` on unused (padding) nodes of ragged trees.
    target_logits : Tensor
        ``[B, T, V]``: row j is the target's output at node j (predicts j's children).
    draft_probs : Tensor, optional
        ``[B, T, V]`` float32: row j is the distribution node j's token was drawn from (row 0
        unused). ``None`` for deterministic drafts.
    params : SamplingParams
        ``[B]`` per-request parameters.
    offset : Tensor, optional
        ``[B]`` int64 Philox counter per request.

    Returns
    -------
    accepted_nodes : Tensor
        ``[B, T]`` int64 accepted non-root nodes, root to leaf, -1 padded.
    tokens : Tensor
        ``[B, T]`` int64: ``tokens[b, :num_accepted[b] + 1]`` are their tokens followed by the
        next token; -1 padded.
    num_accepted : Tensor
        ``[B]`` int64 path length.

    Raises
    ------
    ValueError
        Malformed trees (root not at node 0 or several roots, a parent not before its child,
        which covers cycles, a parent that is padding), draft ids out of range, and the errors of
        :func:`verify_chain`.

    Notes
    -----
    Greedy trees whose siblings repeat a token: this op takes the longest matching path, so
    the output is the same whichever copy a drafter put first. SpecInfer-style verifiers (e.g.
    sgl-kernel's ``verify_tree_greedy``) walk the siblings in order and take the *first* match,
    which can accept fewer drafts; :func:`specdec_kernels.compat.sgl_kernel.verify_tree_greedy`
    follows that rule (it drops repeated siblings after their first copy before calling this
    op). Both emit the target's greedy tokens; only the number accepted per step differs.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> parents = torch.tensor([[-1, 0, 0, 1]])  # node 3 continues node 1
    >>> tree_tokens = torch.tensor([[7, 1, 2, 0]])  # node 0 is the root (not read)
    >>> target_logits = torch.tensor([[[0.0, 3.0, 1.0],  # after node 0: argmax 1 (node 1 holds)
    ...                                [2.0, 0.0, 1.0],  # after node 1: argmax 0 (node 3 holds)
    ...                                [0.0, 0.0, 5.0],  # after node 2
    ...                                [0.0, 3.0, 1.0]]])  # after node 3: argmax 1
    >>> nodes, tokens, num_accepted = ops.verify_tree(
    ...     tree_tokens, parents, target_logits, None, SamplingParams.create(1))
    >>> nodes, tokens, num_accepted
    (tensor([[ 1,  3, -1, -1]]), tensor([[ 1,  0,  1, -1]]), tensor([2]))
    """
    return torch.ops.specdec.verify_tree(
        _int64(tree_tokens),
        _int64(parents),
        target_logits,
        draft_probs,
        *params.tensors(),
        offsets_or_zeros(offset, tree_tokens.shape[0], target_logits.device),
    )


@torch.library.register_fake("specdec::verify_tree")
def _verify_tree_fake(tree_tokens, parents, target_logits, draft_probs, *params):
    return _tree_outputs_fake(tree_tokens)


def typical_verify_chain(
    draft_tokens: Tensor,
    num_draft: Optional[Tensor],
    target_logits: Tensor,
    params: SamplingParams,
    offset: Optional[Tensor] = None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> tuple[Tensor, Tensor]:
    """Typical acceptance of a chain (Medusa). LOSSY: not the target's distribution.

    A draft x at row i is accepted iff ``p_i(x) > min(posterior_threshold, posterior_alpha *
    exp(-H(p_i)))`` with p_i the processed target distribution and H its entropy; drafts are
    accepted up to the first failure, then the next token is drawn from the last row's p
    (greedy requests behave as in :func:`verify_chain`). Draft probabilities are not used.

    Parameters
    ----------
    draft_tokens, num_draft, target_logits, params, offset
        As in :func:`verify_chain`.
    posterior_threshold : float
        Hard threshold epsilon (Medusa's default 0.09).
    posterior_alpha : float
        Entropy-scaled threshold delta (Medusa's default 0.3).

    Returns
    -------
    tokens : Tensor
        ``[B, K+1]`` int64, as in :func:`verify_chain`.
    num_accepted : Tensor
        ``[B]`` int64.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> target_logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]]])
    >>> drafts = torch.tensor([[1, 2]])
    >>> params = SamplingParams.create(1, temperature=1.0)
    >>> _, num_accepted = ops.typical_verify_chain(drafts, None, target_logits, params)
    >>> num_accepted  # p(2) = 0.24 at row 1 is over min(0.09, 0.3 * exp(-H)): both drafts pass
    tensor([2])
    """
    return torch.ops.specdec.typical_verify_chain(
        _int64(draft_tokens),
        _num_draft_or_all(num_draft, draft_tokens),
        target_logits,
        *params.tensors(),
        offsets_or_zeros(offset, draft_tokens.shape[0], target_logits.device),
        float(posterior_threshold),
        float(posterior_alpha),
    )


@torch.library.register_fake("specdec::typical_verify_chain")
def _typical_verify_chain_fake(draft_tokens, num_draft, target_logits, *params):
    return _chain_outputs_fake(draft_tokens)


def typical_verify_tree(
    tree_tokens: Tensor,
    parents: Tensor,
    target_logits: Tensor,
    params: SamplingParams,
    offset: Optional[Tensor] = None,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> tuple[Tensor, Tensor, Tensor]:
    """Typical acceptance over a tree (Medusa). LOSSY: not the target's distribution.

    A node passes iff its token x satisfies the rule of :func:`typical_verify_chain` on its
    parent's processed distribution; the result is the longest path of passing nodes (ties: the
    lowest final node index), then a token drawn from the last node's p (greedy requests: as in
    :func:`verify_tree`).

    Parameters
    ----------
    tree_tokens, parents, target_logits, params, offset
        As in :func:`verify_tree`.
    posterior_threshold, posterior_alpha : float
        As in :func:`typical_verify_chain`.

    Returns
    -------
    accepted_nodes, tokens, num_accepted : Tensor
        As in :func:`verify_tree`.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> from specdec_kernels.sampling import SamplingParams
    >>> parents = torch.tensor([[-1, 0, 0]])  # two candidates for the next token
    >>> tree_tokens = torch.tensor([[7, 0, 2]])
    >>> target_logits = torch.tensor([[[0.0, 3.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    >>> params = SamplingParams.create(1, temperature=1.0)
    >>> nodes, _, num_accepted = ops.typical_verify_tree(
    ...     tree_tokens, parents, target_logits, params)
    >>> nodes[0, :1], num_accepted  # token 0 (p = 0.04) fails, token 2 (p = 0.11) passes
    (tensor([2]), tensor([1]))
    """
    return torch.ops.specdec.typical_verify_tree(
        _int64(tree_tokens),
        _int64(parents),
        target_logits,
        *params.tensors(),
        offsets_or_zeros(offset, tree_tokens.shape[0], target_logits.device),
        float(posterior_threshold),
        float(posterior_alpha),
    )


@torch.library.register_fake("specdec::typical_verify_tree")
def _typical_verify_tree_fake(tree_tokens, parents, target_logits, *params):
    return _tree_outputs_fake(tree_tokens)
