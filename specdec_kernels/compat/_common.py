"""Helpers shared by the peer adapters: per-row sampling parameters given the peers' way
(a scalar or a ``[B]`` tensor) and the Philox streams of :mod:`specdec_kernels.ops`."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from specdec_kernels.sampling import SamplingParams

# Seeds drawn from a torch generator stay below 2^62 (int64, and no sign games).
_SEED_BOUND = 2**62


def param_column(value, batch: int, dtype: torch.dtype, device, name: str) -> Tensor:
    """A per-row parameter given as a scalar or a ``[batch]`` tensor, as a ``[batch]`` tensor.

    The error messages are FlashInfer's (its tests match on them).
    """
    if isinstance(value, Tensor):
        if value.dim() == 0:
            raise ValueError(
                "Expected a 1D tensor of shape (batch_size,) or scalar for the sampling "
                f"parameter {name}, got a 0-dimensional tensor"
            )
        if value.dim() != 1:
            raise ValueError(
                f"Expected a 1D tensor or scalar for the sampling parameter {name}, "
                f"got a {value.dim()}D tensor"
            )
        if value.shape[0] != batch:
            raise ValueError(
                f"Sampling parameter tensor batch size mismatch: {name} has {value.shape[0]} "
                f"values for a batch of {batch}"
            )
        return value.to(device=device, dtype=dtype)
    return torch.full((batch,), value, dtype=dtype, device=device)


def draw_seed(generator: Optional[torch.Generator], device) -> Tensor:
    """``[1]`` int64 seed drawn from ``generator`` (else the device's default generator), so
    ``torch.manual_seed`` makes a run reproducible and every call draws fresh randomness."""
    if generator is not None:
        seed = torch.randint(0, _SEED_BOUND, (1,), generator=generator, device=generator.device)
        return seed.to(device)
    return torch.randint(0, _SEED_BOUND, (1,), device=device)


def _int64_column(value, batch: int, device, name: str) -> Tensor:
    if isinstance(value, Tensor):
        if value.device != torch.device(device):
            raise ValueError(f"{name} tensor must be on {device}, got {value.device}")
        if value.dtype not in (torch.int64, torch.uint64):
            raise ValueError(f"{name} tensor must be int64/uint64, got {value.dtype}")
        if value.dim() != 1 or value.shape[0] not in (1, batch):
            raise ValueError(
                f"{name} tensor must be 1-D of length 1 or {batch}, got {tuple(value.shape)}"
            )
        value = value.view(torch.int64) if value.dtype == torch.uint64 else value
        return value.expand(batch)
    return torch.full((batch,), int(value) & 0x7FFFFFFFFFFFFFFF, dtype=torch.int64, device=device)


def row_streams(
    batch: int,
    device,
    *,
    seed: Union[int, Tensor, None] = None,
    offset: Union[int, Tensor, None] = None,
    generator: Optional[torch.Generator] = None,
) -> tuple[Tensor, Tensor]:
    """Seeds and offsets ``[batch]`` that give every row its own Philox stream.

    Rows share one seed (given, or drawn from ``generator`` when ``seed`` or ``offset`` is
    missing, as FlashInfer does) and differ in the high word of the 64-bit offset: row ``r``
    uses offset ``offset + r * 2^32``, so rows never reuse each other's uniforms.

    Raises
    ------
    ValueError
        ``seed`` and ``offset`` not both tensors or both scalars, or a tensor of the wrong
        dtype, shape or device.
    """
    if seed is None or offset is None:
        seeds = draw_seed(generator, device).expand(batch)
        offsets = torch.zeros(batch, dtype=torch.int64, device=device)
    else:
        if isinstance(seed, Tensor) != isinstance(offset, Tensor):
            raise ValueError("seed and offset must both be tensors or both be scalars")
        seeds = _int64_column(seed, batch, device, "seed")
        offsets = _int64_column(offset, batch, device, "offset")
    rows = torch.arange(batch, dtype=torch.int64, device=device) << 32
    return seeds.contiguous(), (offsets + rows).contiguous()


def make_params(
    batch: int, device, seeds: Tensor, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0
) -> SamplingParams:
    """:class:`SamplingParams` from scalars or ``[batch]`` tensors (already validated)."""

    def col(v, dtype):
        if isinstance(v, Tensor):
            return v.to(device=device, dtype=dtype).expand(batch).contiguous()
        return torch.full((batch,), v, dtype=dtype, device=device)

    return SamplingParams(
        temperature=col(temperature, torch.float32),
        top_k=col(top_k, torch.int64),
        top_p=col(top_p, torch.float32),
        min_p=col(min_p, torch.float32),
        seed=seeds.to(device=device, dtype=torch.int64).contiguous(),
    )


def log_probs(probs: Tensor) -> tuple[Tensor, Tensor]:
    """float32 logits whose processed distribution (temperature 1) is ``probs``, and the rows
    that are a valid distribution (finite, non-negative, positive mass).

    ``log`` keeps zeros as ``-inf`` (which the ops accept); invalid rows get zero logits so the
    ops never see them, and the caller decides what they return. Each row is first scaled by
    a power of two (exact) that brings its maximum into ``[0.5, 1)``: there ``log`` is strictly
    increasing in float32, so the most likely tokens keep their order and no two distinct
    probabilities near the top tie (top-k, top-p and min-p thresholds stay exact).
    """
    p = probs.float()
    valid = torch.isfinite(p).all(-1) & (p >= 0).all(-1) & (p.sum(-1) > 0)
    p = p.clamp_min(0)
    exponent = torch.frexp(p.amax(-1, keepdim=True)).exponent
    scaled = torch.ldexp(p, -exponent.to(torch.float32))
    logits = torch.where(valid.unsqueeze(-1), torch.log(scaled), torch.zeros_like(p))
    return logits.contiguous(), valid


def check_int_dtype(t: Tensor, name: str) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
