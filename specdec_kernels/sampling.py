"""Per-request sampling parameters shared by the sampling and verification ops.

A batch of requests carries one value of each parameter per request, as ``[B]`` tensors on the
logits' device, so a batch may mix greedy and sampling requests and settings. The processed
distribution they define (temperature, then top-k, top-p, min-p) is documented in
:func:`specdec_kernels.ops.sample`; the random stream each request draws from in
:mod:`specdec_kernels.reference` (``uniforms``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence, Union

import torch
from torch import Tensor

__all__ = ["SamplingParams"]

Scalars = Union[float, int, Sequence[float], Sequence[int], Tensor]


def _column(value: Scalars, batch: int, dtype: torch.dtype, device, name: str) -> Tensor:
    t = torch.as_tensor(value, dtype=dtype)
    if t.dim() == 0:
        t = t.expand(batch)
    if t.shape != (batch,):
        raise ValueError(f"{name} must be a scalar or have {batch} values, got shape {tuple(t.shape)}")
    return t.to(device).contiguous().clone()


@dataclass
class SamplingParams:
    """Sampling parameters of a batch of requests, each a ``[B]`` tensor.

    Attributes
    ----------
    temperature : Tensor
        ``[B]`` float32. ``0`` means greedy (argmax, ties to the lowest token id); otherwise a
        positive finite value (logits are divided by it).
    top_k : Tensor
        ``[B]`` int64. Keep the ``top_k`` largest logits (ties with the last one kept);
        ``<= 0`` or ``>= V`` disables it.
    top_p : Tensor
        ``[B]`` float32 in ``(0, 1]``. Keep the smallest set of most likely tokens whose mass
        reaches ``top_p`` (after top-k); ``1`` disables it.
    min_p : Tensor
        ``[B]`` float32 in ``[0, 1)``. Drop tokens less likely than ``min_p`` times the most
        likely one; ``0`` disables it.
    seed : Tensor
        ``[B]`` int64. Key of the request's Philox stream: the same seed and offset give the
        same draws on CPU, CUDA and in the reference, whatever else is in the batch.
    """

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    min_p: Tensor
    seed: Tensor

    @staticmethod
    def create(
        batch: int,
        *,
        temperature: Scalars = 0.0,
        top_k: Scalars = 0,
        top_p: Scalars = 1.0,
        min_p: Scalars = 0.0,
        seed: Scalars = 0,
        device: Union[str, torch.device] = "cpu",
    ) -> "SamplingParams":
        """Parameters for ``batch`` requests from scalars (shared) or per-request sequences.

        Parameters
        ----------
        batch : int
            Number of requests ``B``.
        temperature, top_k, top_p, min_p, seed : scalar, sequence or Tensor
            One value for all requests, or ``B`` values.
        device : str or torch.device
            Device of the logits these parameters will be used with.

        Returns
        -------
        SamplingParams
        """
        return SamplingParams(
            temperature=_column(temperature, batch, torch.float32, device, "temperature"),
            top_k=_column(top_k, batch, torch.int64, device, "top_k"),
            top_p=_column(top_p, batch, torch.float32, device, "top_p"),
            min_p=_column(min_p, batch, torch.float32, device, "min_p"),
            seed=_column(seed, batch, torch.int64, device, "seed"),
        )

    @property
    def batch_size(self) -> int:
        """Number of requests ``B``."""
        return self.temperature.shape[0]

    def to(self, device: Union[str, torch.device]) -> "SamplingParams":
        """The same parameters on ``device``."""
        return SamplingParams(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, index: Tensor) -> "SamplingParams":
        """The parameters of the requests at ``index`` (``[B']`` int64), in that order."""
        return SamplingParams(
            **{f.name: getattr(self, f.name).index_select(0, index) for f in fields(self)}
        )

    def repeat_interleave(self, repeats: int) -> "SamplingParams":
        """Each request's parameters ``repeats`` times in a row (e.g. one row per draft position)."""
        return SamplingParams(
            **{f.name: getattr(self, f.name).repeat_interleave(repeats) for f in fields(self)}
        )

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(temperature, top_k, top_p, min_p, seed)``, the order the raw ops take them in."""
        return (self.temperature, self.top_k, self.top_p, self.min_p, self.seed)
