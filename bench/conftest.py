"""Microbenchmark fixtures: every benchmark runs on CPU and, when CUDA kernels are built and a
GPU is visible, on CUDA. Timings include a device synchronisation so GPU work is counted."""

import pytest
import torch

import specdec_kernels

DEVICES = ["cpu"]
if torch.cuda.is_available() and specdec_kernels.has_cuda_kernels():
    DEVICES.append("cuda")


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def synchronized(fn, device):
    """Wrap `fn` so each call waits for the device: benchmark timers then see the kernel time."""
    if device != "cuda":
        return fn

    def run():
        fn()
        torch.cuda.synchronize()

    return run


def record_bandwidth(benchmark, bytes_moved):
    """Store achieved GB/s (from the median time) in the benchmark's extra_info."""
    median = benchmark.stats.stats.median
    benchmark.extra_info["bytes"] = bytes_moved
    benchmark.extra_info["GB/s"] = round(bytes_moved / median / 1e9, 2)


def pytest_benchmark_update_machine_info(config, machine_info):
    """Name what the figures depend on beyond the CPU: the instruction set of the package's
    kernels and of torch's, threads, torch version."""
    from specdec_kernels.bench import machine

    machine_info["specdec"] = machine.machine_info()
