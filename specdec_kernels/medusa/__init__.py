"""Medusa heads for a frozen target (:mod:`.heads`: the network and its file formats). Their
self-distillation data and training (``specdec train medusa``) are asset builders:
:mod:`specdec_kernels.training.medusa_data`, :mod:`specdec_kernels.training.medusa`. The drafters
that decode with them are in :mod:`specdec_kernels.decoding.medusa`."""

from specdec_kernels.medusa.heads import MedusaHeads, load_heads

__all__ = ["MedusaHeads", "load_heads"]
