"""vLLM v1's rejection sampler (``vllm.v1.sample.rejection_sampler``) on this package's ops.

Switch with one line: ``from specdec_kernels.compat.vllm import rejection_sample,
RejectionSampler, PLACEHOLDER_TOKEN_ID, MAX_SPEC_LEN``. The layout is vLLM's: the drafts of
all requests flattened into ``[num_tokens]`` (ragged, delimited by ``cu_num_draft_tokens``),
target rows ``[num_tokens, vocab_size]``, bonus tokens ``[batch_size, 1]`` sampled by the
caller, and the output ``[batch_size, max_spec_len + 1]`` int32 with ``-1`` placeholders after
each request's tokens. A request is greedy when its temperature is 0 (vLLM's
``GREEDY_TEMPERATURE``; the older -1 also counts). Every call is one
:func:`specdec_kernels.ops.verify_chain` launch.

- :func:`rejection_sample` is vLLM's functional core: ``target_probs`` are the processed target
  probabilities (temperature, top-k, top-p already applied by the caller).
- :class:`RejectionSampler` is the module form that takes target *logits* and the sampling
  metadata; temperature, top-k and top-p are fused into the verification kernel (no
  ``[num_tokens, vocab_size]`` probability tensor is made).

Differences from vLLM (also in the README): random streams are this package's Philox streams
(seeded per request from ``sampling_metadata.generators[i]`` when present, else from torch's
default generator), so seeded requests are reproducible but do not reproduce vLLM's samples;
a draft is accepted iff ``u * q(x) < p(x)`` (vLLM: ``p(x) / q(x) >= u``; they differ only at
equality); when the residual ``max(p - q, 0)`` is all zero the recovered token is drawn from
``p`` (vLLM's argmax would return token 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.compat._common import _SEED_BOUND, check_int_dtype, log_probs, make_params

__all__ = [
    "GREEDY_TEMPERATURE",
    "MAX_SPEC_LEN",
    "PLACEHOLDER_TOKEN_ID",
    "RejectionSampler",
    "SamplingMetadata",
    "SpecDecodeMetadata",
    "rejection_sample",
]

#: Output value of the positions after a request's last token.
PLACEHOLDER_TOKEN_ID = -1
#: Temperature that marks a greedy request (vLLM's current value; -1, its older one, too).
GREEDY_TEMPERATURE = 0
#: Largest ``max_spec_len`` accepted (vLLM's limit).
MAX_SPEC_LEN = 128


@dataclass
class SamplingMetadata:
    """The fields of vLLM's ``SamplingMetadata`` the rejection sampler reads (any object with
    these attributes, vLLM's own included, works).

    Attributes
    ----------
    temperature : Tensor or None
        ``[batch_size]`` float32; 0 (or -1) marks greedy requests. ``None`` when all greedy.
    all_greedy, all_random : bool
    top_p : Tensor or None
        ``[batch_size]`` float32 in ``(0, 1]`` (used by :class:`RejectionSampler` only).
    top_k : Tensor or None
        ``[batch_size]`` int (used by :class:`RejectionSampler` only; ``<= 0`` or ``>= V`` off).
    generators : dict of int to torch.Generator
        Per-request generators of seeded requests.
    """

    temperature: Optional[Tensor] = None
    all_greedy: bool = True
    all_random: bool = False
    top_p: Optional[Tensor] = None
    top_k: Optional[Tensor] = None
    generators: dict = field(default_factory=dict)


@dataclass
class SpecDecodeMetadata:
    """The fields of vLLM's ``SpecDecodeMetadata`` the rejection sampler reads.

    Attributes
    ----------
    draft_token_ids : Tensor
        ``[num_tokens]`` int32 drafts of all requests, concatenated.
    num_draft_tokens : list of int
        Drafts per request.
    cu_num_draft_tokens : Tensor
        ``[batch_size]`` int32 inclusive cumulative sum of ``num_draft_tokens``.
    max_spec_len : int
        ``max(num_draft_tokens)`` (the output has ``max_spec_len + 1`` columns).
    """

    draft_token_ids: Tensor
    num_draft_tokens: list
    cu_num_draft_tokens: Tensor
    max_spec_len: int

    @classmethod
    def make_dummy(cls, draft_token_ids: Sequence[Sequence[int]], device) -> "SpecDecodeMetadata":
        """Metadata for per-request lists of drafts (vLLM's helper of the same name)."""
        counts = [len(ids) for ids in draft_token_ids]
        flat = [int(t) for ids in draft_token_ids for t in ids]
        return cls(
            draft_token_ids=torch.tensor(flat, dtype=torch.int32, device=device),
            num_draft_tokens=counts,
            cu_num_draft_tokens=torch.tensor(counts, dtype=torch.int32, device=device)
            .cumsum(0)
            .to(torch.int32),
            max_spec_len=max(counts, default=0),
        )


def _greedy_rows(sampling_metadata, batch: int, device) -> Tensor:
    if sampling_metadata.all_greedy:
        return torch.ones(batch, dtype=torch.bool, device=device)
    if sampling_metadata.all_random:
        return torch.zeros(batch, dtype=torch.bool, device=device)
    temperature = sampling_metadata.temperature
    if temperature is None or tuple(temperature.shape) != (batch,):
        raise ValueError(
            f"sampling_metadata.temperature must be [{batch}] when requests mix greedy and random"
        )
    return temperature.to(device) <= GREEDY_TEMPERATURE


def _request_seeds(num_draft_tokens: list, generators: dict, device) -> Tensor:
    """One Philox seed per request: from the request's generator when it has one (drawn only
    when it has drafts, as vLLM does), else from torch's default generator."""
    seeds = torch.randint(0, _SEED_BOUND, (len(num_draft_tokens),), device=device)
    for i, generator in (generators or {}).items():
        if num_draft_tokens[i] > 0:
            g_device = generator.device
            seeds[i] = torch.randint(0, _SEED_BOUND, (1,), generator=generator, device=g_device)[
                0
            ].to(device)
    return seeds


def _check_layout(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_rows,
    bonus_token_ids,
) -> None:
    """Shapes, dtypes and limits of vLLM's flattened layout (ValueError naming the argument)."""
    if max_spec_len > MAX_SPEC_LEN:
        raise ValueError(f"max_spec_len {max_spec_len} exceeds MAX_SPEC_LEN={MAX_SPEC_LEN}")
    if draft_token_ids.dim() != 1:
        raise ValueError(
            f"draft_token_ids must be [num_tokens], got {tuple(draft_token_ids.shape)}"
        )
    check_int_dtype(draft_token_ids, "draft_token_ids")
    batch = len(num_draft_tokens)
    num_tokens = draft_token_ids.shape[0]
    if target_rows.dim() != 2 or target_rows.shape[0] != num_tokens:
        raise ValueError(
            f"target rows must be [num_tokens={num_tokens}, vocab_size], "
            f"got {tuple(target_rows.shape)}"
        )
    vocab = target_rows.shape[1]
    if draft_probs is not None and tuple(draft_probs.shape) != (num_tokens, vocab):
        raise ValueError(
            f"draft_probs must be [{num_tokens}, {vocab}], got {tuple(draft_probs.shape)}"
        )
    if tuple(cu_num_draft_tokens.shape) != (batch,):
        raise ValueError(
            f"cu_num_draft_tokens must be [{batch}], got {tuple(cu_num_draft_tokens.shape)}"
        )
    if bonus_token_ids.numel() != batch:
        raise ValueError(
            f"bonus_token_ids must be [{batch}, 1], got {tuple(bonus_token_ids.shape)}"
        )
    if sum(num_draft_tokens) != num_tokens or max(num_draft_tokens, default=0) > max_spec_len:
        raise ValueError(
            f"num_draft_tokens {list(num_draft_tokens)} must sum to num_tokens={num_tokens} and "
            f"not exceed max_spec_len={max_spec_len}"
        )


def _verify(
    draft_token_ids: Tensor,
    num_draft_tokens: list,
    max_spec_len: int,
    cu_num_draft_tokens: Tensor,
    draft_probs: Optional[Tensor],
    target_rows: Tensor,
    bonus_token_ids: Tensor,
    params_for,
) -> Tensor:
    """The ragged chains as one padded ``verify_chain`` launch; ``target_rows`` are logits."""
    _check_layout(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_rows,
        bonus_token_ids,
    )
    batch = len(num_draft_tokens)
    num_tokens = draft_token_ids.shape[0]
    vocab = target_rows.shape[1]
    device = target_rows.device
    k = max_spec_len
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64).to(device)
    starts = cu_num_draft_tokens.to(device=device, dtype=torch.int64) - counts
    pos = torch.arange(k + 1, device=device).unsqueeze(0)  # [1, K+1]
    flat = (starts.unsqueeze(1) + pos).clamp(0, max(num_tokens - 1, 0))
    is_draft = pos < counts.unsqueeze(1)
    # Row counts[b] holds the caller's bonus token as a one-hot distribution: the op's "bonus
    # draw" then returns it for greedy and random requests alike.
    bonus = bonus_token_ids.reshape(batch).to(device=device, dtype=torch.int64)
    one_hot = torch.full((batch, vocab), float("-inf"), device=device)
    one_hot.scatter_(1, bonus.unsqueeze(1), 0.0)
    if num_tokens:
        rows = target_rows.float().index_select(0, flat.flatten()).view(batch, k + 1, vocab)
    else:
        rows = torch.zeros(batch, k + 1, vocab, device=device)
    rows = torch.where(is_draft.unsqueeze(2), rows, torch.zeros_like(rows))
    at_bonus = (pos == counts.unsqueeze(1)).unsqueeze(2)
    logits = torch.where(at_bonus, one_hot.unsqueeze(1), rows).contiguous()
    drafts = torch.zeros(batch, k, dtype=torch.int64, device=device)
    q = None
    if num_tokens:
        drafts = torch.where(
            is_draft[:, :k],
            draft_token_ids.long().index_select(0, flat[:, :k].flatten()).view(batch, k),
            drafts,
        )
        if draft_probs is not None:
            q = draft_probs.float().index_select(0, flat[:, :k].flatten()).view(batch, k, vocab)
    elif draft_probs is not None:
        q = torch.zeros(batch, k, vocab, device=device)
    tokens, _ = ops.verify_chain(drafts, counts, logits, q, params_for(batch, device))
    return tokens.to(torch.int32)


def rejection_sample(
    draft_token_ids: Tensor,
    num_draft_tokens: list,
    max_spec_len: int,
    cu_num_draft_tokens: Tensor,
    draft_probs: Optional[Tensor],
    target_probs: Tensor,
    bonus_token_ids: Tensor,
    sampling_metadata,
) -> Tensor:
    """vLLM v1's ``rejection_sample``: greedy and lossless rejection sampling of ragged chains.

    Greedy requests accept drafts while each equals the target's argmax and emit the argmax at
    the first mismatch; random requests accept draft ``x`` iff ``q(x) > 0`` and ``u * q(x) <
    p(x)`` and emit a token from ``normalize(max(p - q, 0))`` at the first rejection (``q``
    one-hot at the draft when ``draft_probs`` is ``None``, the n-gram case). A request whose
    drafts are all accepted emits its bonus token.

    Parameters
    ----------
    draft_token_ids : Tensor
        ``[num_tokens]`` int32/int64 drafts of all requests, concatenated.
    num_draft_tokens : list of int
        ``[batch_size]`` drafts per request.
    max_spec_len : int
        Output width minus one; at most :data:`MAX_SPEC_LEN`.
    cu_num_draft_tokens : Tensor
        ``[batch_size]`` inclusive cumulative sum of ``num_draft_tokens``.
    draft_probs : Tensor, optional
        ``[num_tokens, vocab_size]`` distributions the drafts were drawn from.
    target_probs : Tensor
        ``[num_tokens, vocab_size]`` processed target probabilities (greedy requests only use
        their argmax, so logits work for them too).
    bonus_token_ids : Tensor
        ``[batch_size, 1]`` tokens to emit after fully accepted chains.
    sampling_metadata
        :class:`SamplingMetadata` or vLLM's (``all_greedy``, ``all_random``, ``temperature``,
        ``generators``).

    Returns
    -------
    Tensor
        ``[batch_size, max_spec_len + 1]`` int32, :data:`PLACEHOLDER_TOKEN_ID` after each
        request's tokens.
    """
    _check_layout(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_probs,
        bonus_token_ids,
    )
    batch, device = len(num_draft_tokens), target_probs.device
    greedy = _greedy_rows(sampling_metadata, batch, device)
    logits, _ = log_probs(target_probs)
    if num_draft_tokens and bool(greedy.any()):
        # Greedy rows keep the values themselves: argmax(p), ties to the lowest id as vLLM.
        owner = torch.repeat_interleave(
            torch.arange(batch, device=device),
            torch.tensor(num_draft_tokens, device=device),
            output_size=target_probs.shape[0],
        )
        logits = torch.where(greedy[owner].unsqueeze(1), target_probs.float(), logits)
    seeds = _request_seeds(num_draft_tokens, sampling_metadata.generators, device)

    def params_for(b, dev):
        return make_params(b, dev, seeds, temperature=torch.where(greedy, 0.0, 1.0))

    return _verify(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        logits,
        bonus_token_ids,
        params_for,
    )


class RejectionSampler(torch.nn.Module):
    """vLLM v1's ``RejectionSampler`` module in the form that takes target logits and bonus
    tokens: ``sampler(metadata, draft_probs, target_logits, bonus_token_ids,
    sampling_metadata)``. Temperature, top-k and top-p of ``sampling_metadata`` are applied to
    the logits inside the verification kernel."""

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: Optional[Tensor],
        target_logits: Tensor,
        bonus_token_ids: Tensor,
        sampling_metadata,
    ) -> Tensor:
        """Verify every request's drafts.

        Parameters
        ----------
        metadata : SpecDecodeMetadata
            Drafts, counts and ``max_spec_len`` (vLLM's or :class:`SpecDecodeMetadata`).
        draft_probs : Tensor, optional
            ``[num_tokens, vocab_size]``.
        target_logits : Tensor
            ``[num_tokens, vocab_size]`` raw target logits.
        bonus_token_ids : Tensor
            ``[batch_size, 1]``.
        sampling_metadata
            Temperature (0: greedy), ``top_k``, ``top_p``, ``generators``.

        Returns
        -------
        Tensor
            ``[batch_size, max_spec_len + 1]`` int32 output tokens, ``-1`` placeholders.
        """
        num_draft_tokens = list(metadata.num_draft_tokens)
        batch, device = len(num_draft_tokens), target_logits.device
        greedy = _greedy_rows(sampling_metadata, batch, device)
        temperature = sampling_metadata.temperature
        if temperature is None:
            temperature = torch.ones(batch, device=device)
        temperature = torch.where(greedy, 0.0, temperature.to(device).float())
        top_k = sampling_metadata.top_k if sampling_metadata.top_k is not None else 0
        top_p = sampling_metadata.top_p if sampling_metadata.top_p is not None else 1.0
        seeds = _request_seeds(num_draft_tokens, sampling_metadata.generators, device)

        def params_for(b, dev):
            return make_params(b, dev, seeds, temperature=temperature, top_k=top_k, top_p=top_p)

        return _verify(
            metadata.draft_token_ids,
            num_draft_tokens,
            metadata.max_spec_len,
            metadata.cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            params_for,
        )
