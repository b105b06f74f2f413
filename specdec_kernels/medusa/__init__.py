"""Medusa heads for a frozen target: the heads (:mod:`.heads`), their self-distillation data
(:mod:`.data`) and training (:mod:`.train`, ``specdec train medusa``). The drafters that
decode with them are in :mod:`specdec_kernels.decoding.medusa`."""

from specdec_kernels.medusa.heads import MedusaHeads, load_heads

__all__ = ["MedusaHeads", "load_heads"]
