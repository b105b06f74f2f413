"""Shared fixtures: every kernel test runs on CPU and, where CUDA kernels are built and a GPU
is visible, on CUDA too, against the pure-torch reference."""

import pytest
import torch

import specdec_kernels

DEVICES = ["cpu"]
if torch.cuda.is_available() and specdec_kernels.has_cuda_kernels():
    DEVICES.append("cuda")

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def gen():
    """A seeded CPU generator: inputs are drawn on CPU and moved, so every device sees the
    same data."""
    return torch.Generator().manual_seed(1234)
