"""The CUDA kernels of tree attention and KV compaction, run on the CPU by the emulator in
``csrc/cuda/emulation`` (each CTA's threads as fibers; mma.sync, ldmatrix, cp.async and shuffles
implemented from the PTX ISA's definitions), so CI without a GPU tests the kernels' indexing,
fragment layouts, pipelining and masking against the reference.

The library is compiled on first use with the host C++ compiler against the CUDA toolkit's
``cuda_fp16.h`` / ``cuda_bf16.h`` (nothing else of CUDA is needed) and cached under
``build/emulation`` by a hash of its sources. :func:`library` returns None, with the reason in
:data:`UNAVAILABLE`, where no compiler or toolkit headers are found.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
SOURCES = [
    CSRC / "cuda" / "emulation" / "kernels_emu.cpp",
    CSRC / "cuda" / "emulation" / "cuda_emulator.h",
    *sorted((CSRC / "core").glob("*.h")),
    *sorted((CSRC / "cuda" / "kernels").glob("*.cuh")),
]
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
UNAVAILABLE = ""
_library = None


def _cuda_include() -> Path | None:
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    for base in candidates:
        if base and (Path(base) / "include" / "cuda_fp16.h").exists():
            return Path(base) / "include"
    return None


def library():
    """The compiled emulation library (ctypes.CDLL), or None (see UNAVAILABLE)."""
    global _library, UNAVAILABLE
    if _library is not None or UNAVAILABLE:
        return _library
    include = _cuda_include()
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if include is None or compiler is None:
        UNAVAILABLE = "no C++ compiler or CUDA toolkit headers (cuda_fp16.h) for the emulator"
        return None
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:16]
    target = ROOT / "build" / "emulation" / f"kernels_emu_{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        command = [compiler, "-std=c++20", "-O1", "-fPIC", "-shared", "-DSPECDEC_EMULATE_CUDA",
                   f"-I{CSRC}", f"-I{include}", str(SOURCES[0]), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError("building the CUDA emulator failed:\n" + result.stderr[-4000:])
        partial.replace(target)
        for stale in target.parent.glob("kernels_emu_*.so"):  # builds of older sources
            if stale != target:
                stale.unlink(missing_ok=True)
    lib = ctypes.CDLL(str(target))
    c_long_p = ctypes.POINTER(ctypes.c_long)
    c_int_p = ctypes.POINTER(ctypes.c_int)
    lib.specdec_emu_tree_attention.restype = ctypes.c_int
    lib.specdec_emu_tree_attention.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
        c_long_p, c_long_p, ctypes.c_double, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_int, c_int_p, ctypes.c_char_p, ctypes.c_int,
    ]
    lib.specdec_emu_compact.restype = ctypes.c_int
    lib.specdec_emu_compact.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), c_long_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_long, ctypes.c_int, c_long_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, c_int_p,
        ctypes.c_char_p, ctypes.c_int,
    ]
    _library = lib
    return lib


def _longs(values):
    return (ctypes.c_long * len(values))(*values)


def view_bytes(t: torch.Tensor) -> int:
    """Bytes from t's first element to just past its last (non-negative strides)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, scale, *, tensor_cores=True,
                   sms=132, ctas_per_sm=2, adversarial=False):
    """The CUDA launcher's kernels for ops.tree_attention, emulated (``adversarial``: the
    emulator's schedule that runs each warp ahead alone, cp.async landing at issue). Returns
    (out, info) with info = (tile head dim or 0 for the SIMT kernel, splits, rows per CTA, keys
    per tile)."""
    lib = library()
    batch, tokens, q_heads, head_dim = q.shape
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)  # every element must be written
    info = (ctypes.c_int * 4)()
    error = ctypes.create_string_buffer(512)
    strides = [*q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3]]
    spans = [view_bytes(q), view_bytes(k_cache), view_bytes(v_cache)]
    rc = lib.specdec_emu_tree_attention(
        DTYPES[q.dtype], q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
        cache_lens.data_ptr(), int(cache_lens.dtype == torch.int64), tree_mask.data_ptr(),
        batch, tokens, q_heads, k_cache.shape[1], head_dim, k_cache.shape[2],
        _longs(strides), _longs(spans), float(scale), int(tensor_cores), sms, ctas_per_sm,
        int(adversarial), info, error, len(error),
    )
    if rc != 0:
        raise RuntimeError(error.value.decode())
    return out, tuple(info)


def _vector_width(caches, quantities):
    for width in (16, 8, 4, 2):
        if all(q % width == 0 for q in quantities) and all(c.data_ptr() % width == 0 for c in caches):
            return width
    return 1


def compact(caches, cache_lens, accept_positions, num_accepted, block_tables=None, *,
            adversarial=False):
    """The CUDA launcher's kernels for ops.compact_kv_cache_ / compact_paged_kv_cache_ (int64
    indices), emulated, in place. Returns 1 (register kernel) or 2 (shared-memory kernel)."""
    lib = library()
    e = caches[0].element_size()
    if block_tables is None:
        batch, heads, capacity, dim = caches[0].shape
        s = caches[0].stride()
        geometry = [s[0] * e, s[1] * e, s[2] * e, capacity]
        quantities = [dim * e, *geometry[:3]]
        tables = None
    else:
        num_blocks, block_size, heads, dim = caches[0].shape
        batch = block_tables.shape[0]
        s = caches[0].stride()
        geometry = [s[0] * e, s[1] * e, s[2] * e, num_blocks, block_size, block_tables.shape[1]]
        quantities = [dim * e, *geometry[:3]]
        tables = block_tables.data_ptr()
    bases = (ctypes.c_void_p * len(caches))(*[c.data_ptr() for c in caches])
    info = (ctypes.c_int * 1)()
    error = ctypes.create_string_buffer(512)
    rc = lib.specdec_emu_compact(
        bases, _longs([view_bytes(c) for c in caches]), len(caches), batch, heads, dim * e,
        _vector_width(caches, quantities), _longs(geometry), tables, cache_lens.data_ptr(),
        accept_positions.data_ptr(), num_accepted.data_ptr(), accept_positions.shape[1],
        int(adversarial), info, error, len(error),
    )
    if rc != 0:
        raise RuntimeError(error.value.decode())
    return info[0]
