"""Build of ``specdec_kernels._C``.

The CPU kernels (``csrc/*.cpp``) are always built. The CUDA kernels (``csrc/cuda/*.cu``) are
added when torch is a CUDA build and a CUDA toolkit is found, or when forced:

    SPECDEC_BUILD_CUDA=auto|0|1   (default auto; 1 with a CPU torch is an error)
    TORCH_CUDA_ARCH_LIST           (default "8.0;9.0+PTX": Ampere and Hopper, PTX for newer)
    MAX_JOBS                       (parallel compile jobs, read by torch's ninja build)

Install with ``pip install --no-build-isolation .`` so the build uses the torch already installed.
"""

import glob
import os
import subprocess
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).resolve().parent
DEFAULT_CUDA_ARCH_LIST = "8.0;9.0+PTX"


def cuda_requested() -> bool:
    """Decide from SPECDEC_BUILD_CUDA, torch and the toolkit whether to build the CUDA kernels."""
    choice = os.environ.get("SPECDEC_BUILD_CUDA", "auto").strip().lower()
    if choice not in ("auto", "0", "1"):
        raise SystemExit(f"SPECDEC_BUILD_CUDA must be auto, 0 or 1, got {choice!r}")
    if choice == "0":
        return False
    torch_has_cuda = torch.version.cuda is not None
    if choice == "1":
        if not torch_has_cuda:
            raise SystemExit(
                f"SPECDEC_BUILD_CUDA=1 but torch {torch.__version__} is a CPU-only build; "
                "install a CUDA build of torch or use SPECDEC_BUILD_CUDA=auto"
            )
        if CUDA_HOME is None:
            raise SystemExit("SPECDEC_BUILD_CUDA=1 but no CUDA toolkit was found (set CUDA_HOME)")
        return True
    return torch_has_cuda and CUDA_HOME is not None


def check_shared_cxx_runtime() -> None:
    """Refuse a C++ compiler that would link its own static libstdc++ into ``_C.so``.

    torch has loaded the shared libstdc++ already; a second, static copy inside the extension
    never initialises its locale, so formatting any error message crashes the process. Seen on
    the GPU machines' image, whose ``CXX=/opt/gcc/bin/g++`` ships only ``libstdc++.a``.
    """
    if not sys.platform.startswith("linux"):
        return
    compiler = os.environ.get("CXX", "c++")
    try:
        found = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return  # the build itself will report a compiler that does not run
    if not os.path.isabs(found):
        raise SystemExit(
            f"the C++ compiler CXX={compiler} finds no shared libstdc++ (libstdc++.so), so it "
            "would link a static copy into specdec_kernels/_C.so and every error raised from C++ "
            "would crash the process; build with a compiler that has one, e.g. "
            "CC=/usr/bin/gcc CXX=/usr/bin/g++"
        )


def write_build_config(with_cuda: bool, arch_list: str) -> None:
    """Record what this build compiled, for ``specdec_kernels.build_info()``."""
    text = (
        "# Written by setup.py at build time; do not edit.\n"
        f"WITH_CUDA = {with_cuda!r}\n"
        f"CUDA_ARCH_LIST = {arch_list!r}\n"
        f"TORCH_VERSION = {torch.__version__!r}\n"
        f"CUDA_VERSION = {torch.version.cuda if with_cuda else None!r}\n"
    )
    (ROOT / "specdec_kernels" / "_build_config.py").write_text(text)


def extensions():
    check_shared_cxx_runtime()
    with_cuda = cuda_requested()
    sources = sorted(glob.glob("csrc/*.cpp"))
    # -ffp-contract=off: no fused multiply-adds (GCC fuses by default where the CPU has FMA,
    # e.g. aarch64), so the CPU kernels round exactly like the reference and the CUDA code.
    cxx_flags = [
        "-O3", "-ffp-contract=off", "-fdiagnostics-color=always", "-Wall",
        "-Wno-unused-function",
    ]
    include_dirs = [str(ROOT / "csrc")]
    if not with_cuda:
        write_build_config(False, "")
        return [
            CppExtension(
                "specdec_kernels._C",
                sources,
                include_dirs=include_dirs,
                extra_compile_args={"cxx": cxx_flags + ["-fopenmp"]},
                extra_link_args=["-fopenmp"],
            )
        ]
    # Decide the arch list here rather than letting torch probe a visible GPU: build machines
    # often have none.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCH_LIST)
    write_build_config(True, os.environ["TORCH_CUDA_ARCH_LIST"])
    sources += sorted(glob.glob("csrc/cuda/*.cu"))
    return [
        CUDAExtension(
            "specdec_kernels._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args={
                "cxx": cxx_flags + ["-fopenmp", "-DSPECDEC_WITH_CUDA"],
                "nvcc": ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-DSPECDEC_WITH_CUDA"],
            },
            extra_link_args=["-fopenmp"],
        )
    ]


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension},
)
