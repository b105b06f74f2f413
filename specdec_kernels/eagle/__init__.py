"""EAGLE-3 draft networks as assets: the network and its files (published layout), loaded by
:mod:`specdec_kernels.decoding.eagle`; built by :mod:`specdec_kernels.training.eagle`."""

from specdec_kernels.eagle.model import EagleConfig, EagleDraftModel, load_eagle, save_eagle

__all__ = ["EagleConfig", "EagleDraftModel", "load_eagle", "save_eagle"]
