"""Shared by the peer-adapter tests: every test runs on CPU and on CUDA (skipped without a GPU
and the CUDA kernels)."""

import pytest
import torch

import specdec_kernels

_HAS_CUDA = torch.cuda.is_available() and specdec_kernels.has_cuda_kernels()

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not _HAS_CUDA, reason="needs a GPU and the CUDA kernels")
    ),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
