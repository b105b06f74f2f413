"""Acceptance rules: how the target's logits over a verified block decide which drafts hold.

Every proposal carries one (:attr:`~specdec_kernels.decoding.drafter.ChainProposal.acceptance`);
the rule makes the verification op call for a chain or a tree and answers with a
:class:`Verdict`, the same for both, from which the engine commits the accepted path.

- :data:`LOSSLESS` (the default): greedy requests emit the target's own greedy tokens, sampling
  requests exactly the target's distribution (rejection sampling against the drafts'
  distributions: :func:`~specdec_kernels.ops.verify_chain`,
  :func:`~specdec_kernels.ops.verify_tree`).
- :class:`Typical` ``(posterior_threshold, posterior_alpha)``: Medusa's typical acceptance
  (:func:`~specdec_kernels.ops.typical_verify_tree`); LOSSY when sampling, the target's greedy
  output for greedy requests. Draft distributions are not used.
- :data:`GREEDY`: the target's argmax whatever a request's temperature (LOSSY when sampling: a
  sampling request decodes greedily); for drafters that only make sense greedily.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.sampling import SamplingParams

__all__ = ["GREEDY", "LOSSLESS", "AcceptanceRule", "Greedy", "Lossless", "Typical", "Verdict"]


@dataclass
class Verdict:
    """What verification decided for every request of a block.

    Attributes
    ----------
    rows : Tensor
        ``[B, P]`` int64 block rows of the accepted path, root first: row 0 (the pending token)
        then the row of every accepted draft; entries past ``num_accepted[b]`` are
        meaningless.
    tokens : Tensor
        ``[B, P]`` int64 accepted drafts then the next token (correction or bonus), ``-1``
        padded.
    num_accepted : Tensor
        ``[B]`` int64 accepted drafts.
    """

    rows: Tensor
    tokens: Tensor
    num_accepted: Tensor

    @classmethod
    def of_chain(cls, tokens: Tensor, num_accepted: Tensor) -> "Verdict":
        """From a chain op's outputs: the accepted path is the block's first rows."""
        batch, width = tokens.shape
        rows = torch.arange(width, device=tokens.device).expand(batch, width)
        return cls(rows, tokens, num_accepted)

    @classmethod
    def of_tree(cls, nodes: Tensor, tokens: Tensor, num_accepted: Tensor) -> "Verdict":
        """From a tree op's outputs: the root, then the accepted nodes."""
        return cls(torch.cat([torch.zeros_like(nodes[:, :1]), nodes[:, :-1]], 1), tokens,
                   num_accepted)


class AcceptanceRule:
    """Base class of acceptance rules: one verification call per block shape.

    Parameters of both methods are those of :func:`~specdec_kernels.ops.verify_chain` and
    :func:`~specdec_kernels.ops.verify_tree` (``probs``: the drafts' distributions, or
    ``None`` for one-hot drafts).
    """

    def verify_chain(self, drafts: Tensor, num_draft: Tensor, logits: Tensor,
                     probs: Tensor | None, params: SamplingParams, offsets: Tensor) -> Verdict:
        raise NotImplementedError

    def verify_tree(self, tokens: Tensor, parents: Tensor, logits: Tensor,
                    probs: Tensor | None, params: SamplingParams, offsets: Tensor) -> Verdict:
        raise NotImplementedError


@dataclass(frozen=True)
class Lossless(AcceptanceRule):
    """The target's greedy tokens, or exactly its distribution (see the module notes)."""

    def verify_chain(self, drafts, num_draft, logits, probs, params, offsets) -> Verdict:
        # K = 0 (plain decoding) goes through the same op: one random stream per method.
        return Verdict.of_chain(*ops.verify_chain(drafts, num_draft, logits, probs, params,
                                                  offsets))

    def verify_tree(self, tokens, parents, logits, probs, params, offsets) -> Verdict:
        return Verdict.of_tree(*ops.verify_tree(tokens, parents, logits, probs, params, offsets))


@dataclass(frozen=True)
class Typical(AcceptanceRule):
    """Medusa's typical acceptance: a draft ``x`` holds iff ``p(x) > min(posterior_threshold,
    posterior_alpha * exp(-H(p)))`` (LOSSY when sampling).

    Attributes
    ----------
    posterior_threshold, posterior_alpha : float
        Epsilon and alpha (Medusa's defaults 0.09 and 0.3).
    """

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    def verify_chain(self, drafts, num_draft, logits, probs, params, offsets) -> Verdict:
        return Verdict.of_chain(*ops.typical_verify_chain(
            drafts, num_draft, logits, params, offsets, self.posterior_threshold,
            self.posterior_alpha,
        ))

    def verify_tree(self, tokens, parents, logits, probs, params, offsets) -> Verdict:
        return Verdict.of_tree(*ops.typical_verify_tree(
            tokens, parents, logits, params, offsets, self.posterior_threshold,
            self.posterior_alpha,
        ))


@dataclass(frozen=True)
class Greedy(AcceptanceRule):
    """The target's argmax for every request, whatever its temperature (LOSSY when sampling)."""

    def verify_chain(self, drafts, num_draft, logits, probs, params, offsets) -> Verdict:
        return LOSSLESS.verify_chain(drafts, num_draft, logits, None, _greedy(params), offsets)

    def verify_tree(self, tokens, parents, logits, probs, params, offsets) -> Verdict:
        return LOSSLESS.verify_tree(tokens, parents, logits, None, _greedy(params), offsets)


def _greedy(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, temperature=torch.zeros_like(params.temperature))


#: The default rule of every proposal.
LOSSLESS = Lossless()
#: Greedy verification whatever the requests' temperatures.
GREEDY = Greedy()
