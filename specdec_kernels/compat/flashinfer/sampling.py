"""FlashInfer's ``flashinfer.sampling`` functions on this package's ops (CPU and CUDA).

Each function has FlashInfer's signature and semantics: probabilities or logits as FlashInfer
takes them, ``int32`` samples (the ``indices`` dtype when given), per-row parameters as a
scalar or a ``[batch_size]`` tensor (FlashInfer's error messages for other shapes), ``seed``
/ ``offset`` or a ``torch.Generator`` for the randomness, ``return_valid`` / ``check_nan`` for
degenerate rows, and the in-place counters of :func:`chain_speculative_sampling`. Underneath,
every call is one :func:`specdec_kernels.ops.sample`, :func:`~specdec_kernels.ops.sample_with_probs`
or :func:`~specdec_kernels.ops.verify_chain` launch on ``log(probs)`` (whose processed
distribution at temperature 1 is ``probs``) or on the logits.

What differs from FlashInfer (also in the README):

- Random streams: the same ``seed``/``offset`` (or generator state) gives the same samples on
  CPU and CUDA here, but not FlashInfer's samples (different Philox mapping); without them a
  seed is drawn from the generator (``torch.manual_seed`` makes runs reproducible).
- ``deterministic`` is accepted and ignored: these kernels are always deterministic.
- ``top_k_first`` / ``joint`` keep exactly the documented sets; ties at a threshold are kept.
- :func:`chain_speculative_sampling` rejects a draft whose draft probability is 0 (FlashInfer
  accepts it when the target's is positive: such a draft cannot have come from the draft
  distribution); an all-zero residual falls back to the target distribution. Its
  ``output_accepted_token_num`` (independent acceptances) draws the uniforms of the positions
  after the first rejection from ``generator`` (or torch's default generator).
- Logits with NaN or +Inf raise ``ValueError`` (FlashInfer's output is unspecified); rows of
  probabilities that are not a distribution give sample 0 and ``valid = False``, as FlashInfer.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.compat._common import (
    check_int_dtype,
    log_probs,
    make_params,
    param_column,
    row_streams,
)

__all__ = [
    "chain_speculative_sampling",
    "min_p_sampling_from_probs",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]

Param = Union[Tensor, float, int]


def _check_2d(t: Tensor, name: str) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be [batch_size, vocab_size], got shape {tuple(t.shape)}")


def _rows(t: Tensor, indices: Optional[Tensor]) -> Tensor:
    """The rows of ``t`` each output samples from (``t[indices]`` when indices are given)."""
    if indices is None:
        return t
    check_int_dtype(indices, "indices")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D [batch_size], got shape {tuple(indices.shape)}")
    return t.index_select(0, indices.to(device=t.device, dtype=torch.int64))


def _check_nan(t: Tensor, what: str) -> None:
    if torch.isnan(t).any():
        raise ValueError(f"Input {what} contains NaN.")


def _draw(
    logits: Tensor,
    valid: Optional[Tensor],
    indices: Optional[Tensor],
    *,
    generator,
    seed,
    offset,
    return_valid: bool = False,
    temperature: Param = 1.0,
    top_k: Param = 0,
    top_p: Param = 1.0,
    min_p: Param = 0.0,
):
    """One :func:`ops.sample` launch over the output rows; invalid rows give sample 0."""
    logits = _rows(logits, indices).contiguous()
    if valid is not None:
        valid = _rows(valid, indices)
    batch, device = logits.shape[0], logits.device
    seeds, offsets = row_streams(batch, device, seed=seed, offset=offset, generator=generator)
    params = make_params(
        batch, device, seeds, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
    samples = ops.sample(logits, params, offsets)
    if valid is not None:
        samples = torch.where(valid, samples, torch.zeros_like(samples))
    samples = samples.to(indices.dtype if indices is not None else torch.int32)
    if return_valid:
        if valid is None:
            valid = torch.ones(batch, dtype=torch.bool, device=device)
        return samples, valid
    return samples


def _output_rows(probs: Tensor, indices: Optional[Tensor]) -> int:
    return indices.shape[0] if indices is not None else probs.shape[0]


_FILTER_DTYPES = {"top_k": torch.int64, "top_p": torch.float32, "min_p": torch.float32}


def _probs_as_logits(probs: Tensor, check_nan: bool) -> tuple[Tensor, Tensor]:
    """``log(probs)`` and the rows that are a distribution, after the shape and NaN checks."""
    _check_2d(probs, "probs")
    if check_nan:
        _check_nan(probs, "probs")
    return log_probs(probs)


def _filter_columns(rows: Tensor, indices: Optional[Tensor], **filters) -> dict:
    """Each filter as a ``[batch_size]`` column of its dtype (FlashInfer's shape errors)."""
    n, device = _output_rows(rows, indices), rows.device
    return {
        name: param_column(value, n, _FILTER_DTYPES[name], device, name)
        for name, value in filters.items()
    }


def softmax(
    logits: Tensor, temperature: Optional[Param] = None, enable_pdl: Optional[bool] = None
) -> Tensor:
    """Softmax of ``logits / temperature`` per row (FlashInfer ``softmax``).

    Parameters
    ----------
    logits : Tensor
        ``[batch_size, vocab_size]`` float32/float16/bfloat16.
    temperature : float or Tensor, optional
        A positive scalar or ``[batch_size]`` tensor; 1 when omitted.
    enable_pdl : bool, optional
        Accepted for compatibility (a CUDA launch detail), ignored.

    Returns
    -------
    Tensor
        ``[batch_size, vocab_size]`` float32 probabilities.
    """
    _check_2d(logits, "logits")
    batch, device = logits.shape[0], logits.device
    t = param_column(
        1.0 if temperature is None else temperature, batch, torch.float32, device, "temperature"
    )
    seeds = torch.zeros(batch, dtype=torch.int64, device=device)
    return ops.sample_with_probs(
        logits.contiguous(), make_params(batch, device, seeds, temperature=t)
    )[1]


def sampling_from_logits(
    logits: Tensor,
    indices: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
) -> Tensor:
    """One sample per output row from ``softmax(logits)`` (FlashInfer ``sampling_from_logits``).

    Parameters
    ----------
    logits : Tensor
        ``[unique_batch_size, vocab_size]``; output ``i`` samples row ``indices[i]`` (row ``i``
        without ``indices``).
    indices : Tensor, optional
        ``[batch_size]`` int32/int64; the output takes its dtype.
    deterministic : bool
        Ignored (always deterministic).
    generator : torch.Generator, optional
        Source of the seed when ``seed``/``offset`` are not given.
    check_nan : bool
        Raise ``ValueError`` if the logits hold a NaN (they raise anyway here).
    seed, offset : int or Tensor, optional
        Philox seed and offset (both scalars, or int64 tensors of length 1 or batch_size).

    Returns
    -------
    Tensor
        ``[batch_size]`` int32 samples (dtype of ``indices`` when given).
    """
    _check_2d(logits, "logits")
    if check_nan:
        _check_nan(logits, "logits")
    return _draw(logits, None, indices, generator=generator, seed=seed, offset=offset)


def sampling_from_probs(
    probs: Tensor,
    indices: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
    return_valid: bool = False,
):
    """One sample per output row from ``probs`` (FlashInfer ``sampling_from_probs``).

    Rows are sampled in proportion to their entries (normalisation is not required). A row with
    a NaN, an infinite or a negative entry, or no mass, gives sample 0 and ``valid = False``.

    Parameters
    ----------
    probs : Tensor
        ``[unique_batch_size, vocab_size]`` probabilities.
    indices, deterministic, generator, check_nan, seed, offset
        As in :func:`sampling_from_logits`.
    return_valid : bool
        Also return the ``[batch_size]`` bool tensor of rows that were a distribution.

    Returns
    -------
    Tensor or (Tensor, Tensor)
        ``[batch_size]`` samples, and ``valid`` when ``return_valid``.
    """
    logits, valid = _probs_as_logits(probs, check_nan)
    stream = dict(generator=generator, seed=seed, offset=offset)
    return _draw(logits, valid, indices, return_valid=return_valid, **stream)


def top_p_sampling_from_probs(
    probs: Tensor,
    top_p: Param,
    indices: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
    return_valid: bool = False,
):
    """Nucleus sampling from ``probs``: the smallest set of most likely tokens whose mass
    reaches ``top_p`` (FlashInfer ``top_p_sampling_from_probs``).

    Parameters
    ----------
    probs : Tensor
        ``[unique_batch_size, vocab_size]``.
    top_p : float or Tensor
        In ``(0, 1]``, a scalar or ``[batch_size]`` (one per output row).
    indices, deterministic, generator, check_nan, seed, offset, return_valid
        As in :func:`sampling_from_probs`.
    """
    logits, valid = _probs_as_logits(probs, check_nan)
    stream = dict(generator=generator, seed=seed, offset=offset)
    columns = _filter_columns(probs, indices, top_p=top_p)
    return _draw(logits, valid, indices, return_valid=return_valid, **stream, **columns)


def top_k_sampling_from_probs(
    probs: Tensor,
    top_k: Param,
    indices: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
    return_valid: bool = False,
):
    """Top-k sampling from ``probs``: the ``top_k`` most likely tokens, ties with the k-th kept
    (FlashInfer ``top_k_sampling_from_probs``).

    Parameters
    ----------
    probs : Tensor
        ``[unique_batch_size, vocab_size]``.
    top_k : int or Tensor
        A scalar or ``[batch_size]``; ``<= 0`` or ``>= vocab_size`` keeps every token.
    indices, deterministic, generator, check_nan, seed, offset, return_valid
        As in :func:`sampling_from_probs`.
    """
    logits, valid = _probs_as_logits(probs, check_nan)
    stream = dict(generator=generator, seed=seed, offset=offset)
    columns = _filter_columns(probs, indices, top_k=top_k)
    return _draw(logits, valid, indices, return_valid=return_valid, **stream, **columns)


def min_p_sampling_from_probs(
    probs: Tensor,
    min_p: Param,
    indices: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
    return_valid: bool = False,
):
    """Min-p sampling from ``probs``: tokens with ``p >= min_p * max(p)``
    (FlashInfer ``min_p_sampling_from_probs``).

    Parameters
    ----------
    probs : Tensor
        ``[unique_batch_size, vocab_size]``.
    min_p : float or Tensor
        In ``[0, 1]``, a scalar or ``[batch_size]``; 1 keeps only the most likely token(s).
    indices, deterministic, generator, check_nan, seed, offset, return_valid
        As in :func:`sampling_from_probs`.
    """
    logits, valid = _probs_as_logits(probs, check_nan)
    stream = dict(generator=generator, seed=seed, offset=offset)
    min_p = _filter_columns(probs, indices, min_p=min_p)["min_p"]
    # min_p = 1 keeps p >= max(p): exactly the top-1 set with ties (the ops take min_p < 1).
    only_max = min_p == 1
    kept_min_p = torch.where(only_max, torch.zeros_like(min_p), min_p)
    return _draw(logits, valid, indices, return_valid=return_valid, **stream,
                 top_k=only_max.to(torch.int64), min_p=kept_min_p)


def _top_k_top_p(
    logits: Tensor,
    valid: Optional[Tensor],
    top_k: Param,
    top_p: Param,
    indices: Optional[Tensor],
    filter_apply_order: str,
    stream: dict,
    return_valid: bool,
):
    """Top-k and top-p sampling in FlashInfer's two filter orders; ``stream`` holds the
    ``generator``/``seed``/``offset`` keywords of :func:`_draw`."""
    columns = _filter_columns(logits, indices, top_k=top_k, top_p=top_p)
    if filter_apply_order == "top_k_first":
        # Top-k, then top-p over the renormalised top-k set: the ops' own order.
        return _draw(logits, valid, indices, return_valid=return_valid, **stream, **columns)
    if filter_apply_order != "joint":
        raise ValueError(f"Invalid filter_apply_order: {filter_apply_order}")
    top_k, top_p = columns["top_k"], columns["top_p"]
    n, device = top_k.shape[0], logits.device
    # Joint: in the top-k set and in the top-p set of the whole distribution. Both sets are
    # prefixes of the sorted vocabulary, so the top-p set first, then top-k within it.
    rows = _rows(logits, indices).contiguous()
    zeros = torch.zeros(n, dtype=torch.int64, device=device)
    nucleus = ops.sample_with_probs(rows, make_params(n, device, zeros, top_p=top_p))[1]
    masked = torch.where(nucleus > 0, rows, torch.full_like(rows, float("-inf")))
    row_valid = None if valid is None else _rows(valid, indices)
    result = _draw(masked, row_valid, None, return_valid=return_valid, **stream, top_k=top_k)
    if indices is None:
        return result
    if isinstance(result, tuple):
        return result[0].to(indices.dtype), result[1]
    return result.to(indices.dtype)


def top_k_top_p_sampling_from_probs(
    probs: Tensor,
    top_k: Param,
    top_p: Param,
    indices: Optional[Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
    return_valid: bool = False,
):
    """Top-k and top-p sampling from ``probs`` (FlashInfer ``top_k_top_p_sampling_from_probs``).

    Parameters
    ----------
    probs : Tensor
        ``[unique_batch_size, vocab_size]``.
    top_k, top_p
        As in :func:`top_k_sampling_from_probs` and :func:`top_p_sampling_from_probs`.
    filter_apply_order : str
        ``"top_k_first"``: top-p over the renormalised top-k set (one fused launch);
        ``"joint"``: tokens in both the top-k set and the top-p set of the whole distribution.
    indices, deterministic, generator, check_nan, seed, offset, return_valid
        As in :func:`sampling_from_probs`.
    """
    logits, valid = _probs_as_logits(probs, check_nan)
    stream = dict(generator=generator, seed=seed, offset=offset)
    return _top_k_top_p(
        logits, valid, top_k, top_p, indices, filter_apply_order, stream, return_valid
    )


def top_k_top_p_sampling_from_logits(
    logits: Tensor,
    top_k: Param,
    top_p: Param,
    indices: Optional[Tensor] = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    check_nan: bool = False,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
) -> Tensor:
    """Top-k and top-p sampling from ``softmax(logits)``, the filters fused into one launch for
    ``"top_k_first"`` (FlashInfer ``top_k_top_p_sampling_from_logits``).

    Parameters
    ----------
    logits : Tensor
        ``[unique_batch_size, vocab_size]`` float32/float16/bfloat16.
    top_k, top_p, indices, filter_apply_order, deterministic, generator, check_nan, seed, offset
        As in :func:`top_k_top_p_sampling_from_probs`.

    Returns
    -------
    Tensor
        ``[batch_size]`` int32 samples (dtype of ``indices`` when given).
    """
    _check_2d(logits, "logits")
    if check_nan:
        _check_nan(logits, "logits")
    stream = dict(generator=generator, seed=seed, offset=offset)
    return _top_k_top_p(
        logits.contiguous(), None, top_k, top_p, indices, filter_apply_order, stream, False
    )


def _renorm(probs: Tensor, **filters) -> Tensor:
    """``probs`` restricted to the set the filters keep, renormalised."""
    _check_2d(probs, "probs")
    batch, device = probs.shape[0], probs.device
    columns = _filter_columns(probs, None, **filters)
    logits, _ = log_probs(probs)
    seeds = torch.zeros(batch, dtype=torch.int64, device=device)
    renormed = ops.sample_with_probs(logits, make_params(batch, device, seeds, **columns))[1]
    return renormed.to(probs.dtype)


def top_p_renorm_probs(probs: Tensor, top_p: Param, is_deterministic: bool = False) -> Tensor:
    """``probs`` restricted to each row's top-p set and renormalised
    (FlashInfer ``top_p_renorm_probs``).

    Parameters
    ----------
    probs : Tensor
        ``[batch_size, vocab_size]``.
    top_p : float or Tensor
        In ``(0, 1]``, a scalar or ``[batch_size]``.
    is_deterministic : bool
        Ignored (always deterministic).

    Returns
    -------
    Tensor
        ``[batch_size, vocab_size]``, dtype of ``probs``.
    """
    return _renorm(probs, top_p=top_p)


def top_k_renorm_probs(probs: Tensor, top_k: Param) -> Tensor:
    """``probs`` restricted to each row's ``top_k`` most likely tokens (ties with the k-th
    kept) and renormalised (FlashInfer ``top_k_renorm_probs``).

    Parameters
    ----------
    probs : Tensor
        ``[batch_size, vocab_size]``.
    top_k : int or Tensor
        A scalar or ``[batch_size]``.

    Returns
    -------
    Tensor
        ``[batch_size, vocab_size]``, dtype of ``probs``.
    """
    return _renorm(probs, top_k=top_k)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs


def chain_speculative_sampling(
    draft_probs: Tensor,
    draft_token_ids: Tensor,
    target_probs: Tensor,
    maybe_output_accepted_token_num: Optional[Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Optional[Param] = None,
    offset: Optional[Param] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless speculative sampling of a chain of drafts per request
    (FlashInfer ``chain_speculative_sampling``), on :func:`specdec_kernels.ops.verify_chain`.

    Draft ``i`` is accepted iff ``q_i(x_i) > 0`` and ``u * q_i(x_i) < p_i(x_i)``; at the first
    rejection the next token is drawn from ``normalize(max(0, p_i - q_i))``; if every draft is
    accepted a bonus token is drawn from ``p_K``.

    Parameters
    ----------
    draft_probs : Tensor
        ``[batch_size, num_speculate_tokens, vocab_size]`` distributions the drafts were drawn
        from.
    draft_token_ids : Tensor
        ``[batch_size, num_speculate_tokens]`` int32/int64.
    target_probs : Tensor
        ``[batch_size, num_speculate_tokens + 1, vocab_size]`` target probabilities (already
        processed: temperature, top-k, ... are the caller's).
    maybe_output_accepted_token_num : Tensor, optional
        ``[batch_size]`` int32 counter, incremented in place by the number of drafts that
        would be accepted if each were tested on its own; created (zeros) when omitted.
    maybe_output_emitted_draft_token_num : Tensor, optional
        ``[batch_size]`` int32 counter, incremented in place by the drafts emitted (the bonus
        excluded); created (zeros) when omitted.
    deterministic : bool
        Ignored (always deterministic).
    generator, seed, offset
        As in :func:`sampling_from_probs`.

    Returns
    -------
    output_token_ids : Tensor
        ``[batch_size, num_speculate_tokens + 1]`` int32: accepted drafts, then the correction
        or bonus token, then ``-1``.
    output_accepted_token_num, output_emitted_draft_token_num : Tensor
        The two ``[batch_size]`` counters.
    """
    if draft_probs.dim() != 3 or draft_token_ids.dim() != 2 or target_probs.dim() != 3:
        raise ValueError(
            "expected draft_probs [B, K, V], draft_token_ids [B, K] and target_probs "
            f"[B, K+1, V], got {tuple(draft_probs.shape)}, {tuple(draft_token_ids.shape)} "
            f"and {tuple(target_probs.shape)}"
        )
    batch, k, vocab = draft_probs.shape
    if tuple(draft_token_ids.shape) != (batch, k) or tuple(target_probs.shape) != (
        batch,
        k + 1,
        vocab,
    ):
        raise ValueError(
            f"shapes disagree: draft_probs {tuple(draft_probs.shape)}, draft_token_ids "
            f"{tuple(draft_token_ids.shape)}, target_probs {tuple(target_probs.shape)} "
            "(expected [B, K, V], [B, K], [B, K+1, V])"
        )
    check_int_dtype(draft_token_ids, "draft_token_ids")
    device = draft_probs.device
    accepted_out = maybe_output_accepted_token_num
    if accepted_out is None:
        accepted_out = torch.zeros(batch, dtype=torch.int32, device=device)
    emitted_out = maybe_output_emitted_draft_token_num
    if emitted_out is None:
        emitted_out = torch.zeros(batch, dtype=torch.int32, device=device)
    for name, counter in (("accepted", accepted_out), ("emitted", emitted_out)):
        if counter.shape != (batch,):
            raise ValueError(f"the {name} counter must be [{batch}], got {tuple(counter.shape)}")

    q = draft_probs.float().contiguous()
    logits, _ = log_probs(target_probs)
    ids = draft_token_ids.long()
    seeds, offsets = row_streams(batch, device, seed=seed, offset=offset, generator=generator)
    tokens, num_accepted = ops.verify_chain(
        ids, None, logits, q, make_params(batch, device, seeds), offsets
    )

    # Acceptances counted one draft at a time: the chain's own decisions up to its first
    # rejection, fresh uniforms for the drafts after it.
    if k > 0:
        p_x = target_probs[:, :k].float().gather(2, ids.unsqueeze(-1)).squeeze(-1)
        q_x = q.gather(2, ids.unsqueeze(-1)).squeeze(-1)
        if generator is not None:
            u = torch.rand((batch, k), generator=generator, device=generator.device).to(device)
        else:
            u = torch.rand((batch, k), device=device)
        after = torch.arange(k, device=device).unsqueeze(0) > num_accepted.unsqueeze(1)
        later = ((u * q_x < p_x) & after).sum(1)
    else:
        later = torch.zeros_like(num_accepted)
    accepted_out += (num_accepted + later).to(accepted_out.dtype)
    emitted_out += num_accepted.to(emitted_out.dtype)
    return tokens.to(torch.int32), accepted_out, emitted_out
