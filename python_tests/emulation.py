"""Every CUDA kernel of the package run on the CPU by the emulator in ``csrc/cuda/emulation``
(each CTA's threads as fibers; clusters, warp collectives with masks, atomics, mma.sync,
ldmatrix and cp.async implemented from the PTX ISA's definitions; shared-memory races,
out-of-bounds shared accesses and accesses to guard zones around every buffer reported), with
the launch configuration its launcher in ``csrc/cuda/*.cu`` derives, so CI without a GPU tests
the kernels' indexing, synchronisation and decisions against the reference and the CPU kernels.

The library is compiled on first use with the host C++ compiler against the CUDA toolkit's
``cuda_fp16.h`` / ``cuda_bf16.h`` (nothing else of CUDA is needed): one object per translation
unit (the runtime, and one unit per kernel family), each cached under ``build/emulation`` by a
hash of its sources and the project headers it includes, so a change to one kernel's header
recompiles only the units that include it. The kernels' units are compiled with
``-fsanitize=thread``: the emulator implements those hooks to check every load and store.
:func:`library` returns None, with the reason in :data:`UNAVAILABLE`, where no compiler or
toolkit headers are found. scripts/mutation_check.py builds variants whose units come from a
mutated copy of ``csrc`` (:func:`build`'s ``variant``) and loads them with :func:`load`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
CACHE = ROOT / "build" / "emulation"
EMULATION = Path("cuda") / "emulation"
RUNTIME = EMULATION / "cuda_emulator.cpp"
FLAGS = ["-std=c++20", "-O1", "-fPIC", "-ffp-contract=off", "-DSPECDEC_EMULATE_CUDA",
         "-Wno-unknown-pragmas"]
# The -fsanitize=thread hooks (implemented by the runtime) on every load and store.
INSTRUMENT = ["-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0"]
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
UNAVAILABLE = ""
_library = None

# Launch limits of the devices a launcher may see (cudaDeviceGetAttribute): SMs, major compute
# capability, shared memory per SM and per block (opt-in), in bytes.
H100 = (132, 9, 233472, 232448)
A100 = (108, 8, 167936, 166912)


def _cuda_include() -> Path | None:
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    for base in candidates:
        if base and (Path(base) / "include" / "cuda_fp16.h").exists():
            return Path(base) / "include"
    return None


def _includes(csrc: Path, relative: Path, seen: set[Path]) -> None:
    """The project headers `relative` includes, transitively (every #include "..." line)."""
    if relative in seen or not (csrc / relative).exists():
        return
    seen.add(relative)
    for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (csrc / relative).read_text(), re.M):
        _includes(csrc, Path(name), seen)


def unit_key(csrc: Path, unit: Path, flags: list[str]) -> str:
    """Hash of a translation unit's flags, its source and every project header it includes."""
    files: set[Path] = set()
    _includes(csrc, unit, files)
    digest = hashlib.sha256(" ".join(flags).encode())
    for f in sorted(files):
        digest.update(str(f).encode() + b"\0" + (csrc / f).read_bytes())
    return digest.hexdigest()[:16]


def build(csrc: Path = CSRC, cache: Path = CACHE, compiler: str | None = None,
          include: Path | None = None, variant: Path | None = None,
          variant_units: tuple[str, ...] = ()) -> tuple[Path, dict[str, bool]]:
    """Compiles (what is not cached) and links the emulation library of the sources in `csrc`;
    the units named in `variant_units` (e.g. "emulate_sample") come from the sources in
    `variant` instead. Returns its path and, per translation unit, whether it was compiled now."""
    compiler = compiler or shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    include = include or _cuda_include()
    units = [RUNTIME, *sorted(p.relative_to(csrc) for p in (csrc / EMULATION).glob("emulate_*.cpp"))]
    objects, compiled, jobs = [], {}, []
    (cache / "obj").mkdir(parents=True, exist_ok=True)
    for unit in units:
        root = variant if unit.stem in variant_units else csrc
        flags = FLAGS + ([] if unit == RUNTIME else INSTRUMENT)
        obj = cache / "obj" / f"{unit.stem}-{unit_key(root, unit, flags)}.o"
        objects.append(obj)
        compiled[unit.stem] = not obj.exists()
        if compiled[unit.stem]:
            partial = obj.with_suffix(f".{os.getpid()}.tmp")
            jobs.append((obj, partial, [compiler, *flags, f"-I{root}", f"-I{include}", "-c",
                                        str(root / unit), "-o", str(partial)]))

    def run(job):
        obj, partial, command = job
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the CUDA emulator failed ({obj.name}):\n"
                               + result.stderr[-4000:])
        partial.replace(obj)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        list(pool.map(run, jobs))
    key = hashlib.sha256("".join(o.name for o in objects).encode()).hexdigest()[:16]
    target = cache / f"kernels_emu_{key}.so"
    if not target.exists():
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run([compiler, "-shared", *map(str, objects), "-o", str(partial)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError("linking the CUDA emulator failed:\n" + result.stderr[-4000:])
        partial.replace(target)
    return target, compiled


def load(path: Path):
    """The emulation library at `path` (ctypes.CDLL) with its entry points' signatures."""
    lib = ctypes.CDLL(str(path))
    vp, i, l, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_double
    lp, ip = ctypes.POINTER(ctypes.c_long), ctypes.POINTER(ctypes.c_int)
    signatures = {
        "specdec_emu_begin": [i],
        "specdec_emu_guard": [vp, l, ctypes.c_char_p, i],
        "specdec_emu_register": [vp, l],
        "specdec_emu_error": [ctypes.c_char_p, i],
        "specdec_emu_tree_attention": [i, vp, vp, vp, vp, vp, i, vp, i, i, i, i, i, l, lp, d, i,
                                       i, i, ip],
        "specdec_emu_compact": [ctypes.POINTER(vp), i, i, i, l, i, lp, vp, vp, vp, vp, i, i, ip],
        "specdec_emu_rollback": [vp, vp, vp, vp, i, l, l, i],
        "specdec_emu_build_tree_masks": [vp, vp, i, l, l, vp, vp, vp, vp, vp, vp, vp],
        "specdec_emu_build_lookahead_masks": [vp, vp, i, l, l, l, vp, vp, vp],
        "specdec_emu_sample": [vp, i, l, l, ctypes.POINTER(vp), vp, vp, vp, ip, ip],
        "specdec_emu_verify": [i, vp, i, l, l, l, vp, vp, vp, vp, ctypes.POINTER(vp), i, d, d, vp,
                               vp, vp, vp, ip, ip],
        "specdec_emu_selftest": [i, i, vp, vp],
    }
    for name, args in signatures.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = i
    return lib


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
    path, _ = build(CSRC, CACHE, compiler, include)
    _library = load(path)
    return _library


# ----------------------------------------------------------------------------- one emulated call


def view_bytes(t: torch.Tensor) -> int:
    """Bytes from t's first element to just past its last (non-negative strides)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


GUARD_BYTES = 512


class Call:
    """One emulated op call: its schedule, the guarded copies of its buffers (a zone of
    GUARD_BYTES on each side that no kernel may touch) and its error, raised by check()."""

    def __init__(self, adversarial: bool):
        self.lib = library()
        self.lib.specdec_emu_begin(int(adversarial))
        self._keep = []

    def guarded(self, t: torch.Tensor | None, name: str, source: bool = False):
        """A copy of t (same strides, same alignment mod 64) between two guard zones; `source`:
        cp.async may read it."""
        if t is None:
            return None
        span = view_bytes(t)
        misalign = t.data_ptr() % 64
        buffer = torch.empty(2 * GUARD_BYTES + 128 + span, dtype=torch.uint8)
        base = (-buffer.data_ptr()) % 64 + GUARD_BYTES + misalign
        storage = buffer[base: base + max(span, t.element_size())].view(t.dtype)
        copy = torch.as_strided(storage, t.shape, t.stride())
        copy.copy_(t)
        begin = buffer.data_ptr() + base
        for at, before in [(begin - GUARD_BYTES, True), (begin + span, False)]:
            self.lib.specdec_emu_guard(at, GUARD_BYTES, name.encode(), int(before))
        if source:
            self.lib.specdec_emu_register(begin, span)
        self._keep.append(buffer)
        return copy

    def check(self, rc: int = 0):
        error = ctypes.create_string_buffer(1024)
        if self.lib.specdec_emu_error(error, len(error)) or rc:
            raise RuntimeError(error.value.decode() or f"emulation failed (rc {rc})")


def _longs(values):
    return (ctypes.c_long * len(values))(*values)


def _pointers(tensors):
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


# ----------------------------------------------------------------------------- tree attention


def tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, scale, *, tensor_cores=True,
                   sms=132, ctas_per_sm=2, adversarial=False):
    """The CUDA launcher's kernels for ops.tree_attention, emulated. Returns (out, info) with
    info = (tile head dim or 0 for the SIMT kernel, splits, rows per CTA, keys per tile)."""
    call = Call(adversarial)
    batch, tokens, q_heads, head_dim = q.shape
    q_, k_, v_ = (call.guarded(t, n, source=True) for t, n in [(q, "q"), (k_cache, "k_cache"),
                                                                (v_cache, "v_cache")])
    lens = call.guarded(cache_lens, "cache_lens")
    mask = call.guarded(tree_mask, "tree_mask")
    # every element must be written
    out = call.guarded(torch.full(q.shape, float("nan"), dtype=q.dtype), "out")
    info = (ctypes.c_int * 4)()
    strides = [*q_.stride()[:3], *k_.stride()[:3], *v_.stride()[:3]]
    rc = call.lib.specdec_emu_tree_attention(
        DTYPES[q.dtype], q_.data_ptr(), k_.data_ptr(), v_.data_ptr(), out.data_ptr(),
        lens.data_ptr(), int(cache_lens.dtype == torch.int64), mask.data_ptr(),
        batch, tokens, q_heads, k_cache.shape[1], head_dim, k_cache.shape[2], _longs(strides),
        float(scale), int(tensor_cores), sms, ctas_per_sm, info)
    call.check(rc)
    return out.clone(), tuple(info)


# ----------------------------------------------------------------------------- KV cache


def _vector_width(caches, quantities):
    for width in (16, 8, 4, 2):
        if all(q % width == 0 for q in quantities) and all(c.data_ptr() % width == 0 for c in caches):
            return width
    return 1


def compact(caches, cache_lens, accept_positions, num_accepted, block_tables=None, *,
            adversarial=False):
    """The CUDA launcher's kernels for ops.compact_kv_cache_ / compact_paged_kv_cache_ (int64
    indices), emulated, in place. Returns 1 (register kernel) or 2 (shared-memory kernel)."""
    call = Call(adversarial)
    e = caches[0].element_size()
    if block_tables is None:
        batch, heads, capacity, dim = caches[0].shape
        s = caches[0].stride()
        geometry = [s[0] * e, s[1] * e, s[2] * e, capacity]
    else:
        num_blocks, block_size, heads, dim = caches[0].shape
        batch = block_tables.shape[0]
        s = caches[0].stride()
        geometry = [s[0] * e, s[1] * e, s[2] * e, num_blocks, block_size, block_tables.shape[1]]
    width = _vector_width(caches, [dim * e, *geometry[:3]])
    work = [call.guarded(c, f"caches[{n}]") for n, c in enumerate(caches)]
    tables = call.guarded(block_tables, "block_tables")
    lens = call.guarded(cache_lens, "cache_lens")
    positions = call.guarded(accept_positions, "accept_positions")
    counts = call.guarded(num_accepted, "num_accepted")
    info = (ctypes.c_int * 1)()
    rc = call.lib.specdec_emu_compact(
        _pointers(work), len(caches), batch, heads, dim * e, width, _longs(geometry),
        None if tables is None else tables.data_ptr(), lens.data_ptr(), positions.data_ptr(),
        counts.data_ptr(), accept_positions.shape[1], int(cache_lens.dtype == torch.int64), info)
    call.check(rc)
    for c, w in zip(caches, work):
        c.copy_(w)
    cache_lens.copy_(lens)
    return info[0]


def rollback(block_tables, cache_lens, new_lens, block_size, freed_blocks, *, adversarial=False):
    """The CUDA kernel of ops.rollback_paged_kv_cache_, emulated, in place."""
    call = Call(adversarial)
    tables = call.guarded(block_tables, "block_tables")
    lens = call.guarded(cache_lens, "cache_lens")
    targets = call.guarded(new_lens, "new_lens")
    freed = call.guarded(freed_blocks, "freed_blocks")
    rc = call.lib.specdec_emu_rollback(
        tables.data_ptr(), lens.data_ptr(), targets.data_ptr(), freed.data_ptr(),
        block_tables.shape[0], block_tables.shape[1], block_size,
        int(block_tables.dtype == torch.int64))
    call.check(rc)
    for t, w in [(block_tables, tables), (cache_lens, lens), (freed_blocks, freed)]:
        t.copy_(w)


# ----------------------------------------------------------------------------- tree masks


def build_tree_masks(parents, prefix_lens, *, adversarial=False):
    """The CUDA kernel of ops.build_tree_masks, emulated, with the launcher's output
    initialisation (retrieve_paths -1, the rest unwritten: poisoned here). Returns (mask,
    packed, position_ids, depth, retrieve_paths, num_leaves) like reference.build_tree_masks."""
    call = Call(adversarial)
    batch, nodes = parents.shape
    words = (nodes + 31) // 32
    par = call.guarded(parents, "parents")
    lens = call.guarded(prefix_lens, "prefix_lens")
    outputs = [
        call.guarded(torch.full((batch, nodes, nodes), True), "mask"),
        call.guarded(torch.full((batch, nodes, words), -7, dtype=torch.int32), "packed"),
        call.guarded(torch.full((batch, nodes), -7), "position_ids"),
        call.guarded(torch.full((batch, nodes), -7), "depth"),
        call.guarded(torch.full((batch, nodes, nodes), -1), "retrieve_paths"),
        call.guarded(torch.full((batch,), -7), "num_leaves"),
    ]
    has_child = call.guarded(torch.zeros(batch, nodes, dtype=torch.int32), "has_child")
    rc = call.lib.specdec_emu_build_tree_masks(
        par.data_ptr(), lens.data_ptr(), int(parents.dtype == torch.int64), batch, nodes,
        *[o.data_ptr() for o in outputs], has_child.data_ptr())
    call.check(rc)
    return tuple(o.clone() for o in outputs)


def build_lookahead_masks(window, levels, tree_nodes, num_rows, *, adversarial=False):
    """The CUDA kernel of ops.build_lookahead_masks, emulated. Returns (mask, packed,
    positions), every element written by the kernel (the outputs start poisoned)."""
    call = Call(adversarial)
    batch = window.shape[0]
    columns = tree_nodes + num_rows
    words = (columns + 31) // 32
    win = call.guarded(window, "window")
    lev = call.guarded(levels, "levels")
    mask = call.guarded(torch.full((batch, num_rows, columns), True), "mask")
    packed = call.guarded(torch.full((batch, num_rows, words), -7, dtype=torch.int32), "packed")
    positions = call.guarded(torch.full((batch, num_rows), -7), "positions")
    rc = call.lib.specdec_emu_build_lookahead_masks(
        win.data_ptr(), lev.data_ptr(), int(window.dtype == torch.int64), batch, tree_nodes,
        num_rows, mask.data_ptr(), packed.data_ptr(), positions.data_ptr())
    call.check(rc)
    return mask.clone(), packed.clone(), positions.clone()


# ----------------------------------------------------------------------------- sampling, verify


@dataclass
class TeamLaunch:
    """How the launcher laid out the row teams: blocks per team (cluster size), bytes of the
    row slice a block copies into shared memory (0: none), whether bf16 rows use the weight
    table, dynamic shared memory per block, vector width (elements per 16-byte load, or 1)."""

    size: int
    cache_bytes: int
    table: bool
    smem_bytes: int
    vec: int


def _param_pointers(call, params, offset):
    fields = [params.temperature, params.top_k, params.top_p, params.min_p, params.seed, offset]
    names = ["temperature", "top_k", "top_p", "min_p", "seed", "offset"]
    copies = [call.guarded(f.contiguous(), n) for f, n in zip(fields, names)]
    return _pointers(copies)


def _offset(params, offset):
    return torch.zeros_like(params.seed) if offset is None else offset


def _team(info):
    return TeamLaunch(info[0], info[1], bool(info[2]), info[3], info[4])


def sample_with_probs(logits, params, offset=None, *, device=H100, adversarial=False,
                      with_probs=True):
    """The CUDA launcher and kernel of ops.sample_with_probs, emulated. Returns (tokens, probs
    or None, error codes [N] (int64, -1: none), TeamLaunch)."""
    call = Call(adversarial)
    rows, vocab = logits.shape
    offset = _offset(params, offset)
    x = call.guarded(logits.contiguous(), "logits")
    tokens = call.guarded(torch.full((rows,), -7), "tokens")
    probs = call.guarded(torch.full((rows, vocab), float("nan")), "probs") if with_probs else None
    errors = call.guarded(torch.full((rows,), 7), "errors")
    info = (ctypes.c_int * 5)()
    rc = call.lib.specdec_emu_sample(
        x.data_ptr(), DTYPES[logits.dtype], rows, vocab, _param_pointers(call, params, offset),
        tokens.data_ptr(), None if probs is None else probs.data_ptr(), errors.data_ptr(),
        (ctypes.c_int * 4)(*device), info)
    call.check(rc)
    return tokens.clone(), None if probs is None else probs.clone(), errors.clone(), _team(info)


def sample(logits, params, offset=None, **kwargs):
    """ops.sample's CUDA path, emulated: (tokens, error codes, TeamLaunch)."""
    tokens, _, errors, team = sample_with_probs(logits, params, offset, with_probs=False, **kwargs)
    return tokens, errors, team


def _verify(tree, tokens, num_draft, parents, logits, draft_probs, params, offset, typical,
            eps, alpha, device, adversarial):
    call = Call(adversarial)
    batch, rows, vocab = logits.shape
    offset = _offset(params, offset)
    if not tree and num_draft is None:
        num_draft = torch.full((batch,), tokens.shape[1], dtype=torch.int64)
    ins = [call.guarded(None if t is None else t.contiguous(), n) for t, n in [
        (logits, "target_logits"), (tokens, "tokens"), (num_draft, "num_draft"),
        (parents, "parents"), (draft_probs, "draft_probs")]]
    out_tokens = call.guarded(torch.full((batch, rows), -7), "out_tokens")
    out_nodes = call.guarded(torch.full((batch, rows), -7), "out_nodes") if tree else None
    out_n = call.guarded(torch.full((batch,), -7), "num_accepted")
    errors = call.guarded(torch.full((batch,), 7), "errors")
    info = (ctypes.c_int * 5)()
    rc = call.lib.specdec_emu_verify(
        int(tree), ins[0].data_ptr(), DTYPES[logits.dtype], batch, rows, vocab,
        *[None if t is None else t.data_ptr() for t in ins[1:]],
        _param_pointers(call, params, offset), int(typical), eps, alpha,
        out_tokens.data_ptr(), None if out_nodes is None else out_nodes.data_ptr(),
        out_n.data_ptr(), errors.data_ptr(), (ctypes.c_int * 4)(*device), info)
    call.check(rc)
    outputs = (out_nodes.clone(), out_tokens.clone(), out_n.clone()) if tree else \
        (out_tokens.clone(), out_n.clone())
    return outputs, errors.clone(), _team(info)


def verify_chain(draft_tokens, num_draft, target_logits, draft_probs, params, offset=None, *,
                 device=H100, adversarial=False):
    """The CUDA launcher and kernel of ops.verify_chain, emulated (int64 inputs). Returns
    ((tokens, num_accepted), error codes [B], TeamLaunch)."""
    return _verify(False, draft_tokens, num_draft, None, target_logits, draft_probs, params,
                   offset, False, 0.0, 0.0, device, adversarial)


def verify_tree(tree_tokens, parents, target_logits, draft_probs, params, offset=None, *,
                device=H100, adversarial=False):
    """ops.verify_tree's CUDA path, emulated: ((nodes, tokens, num_accepted), errors, team)."""
    return _verify(True, tree_tokens, None, parents, target_logits, draft_probs, params,
                   offset, False, 0.0, 0.0, device, adversarial)


def typical_verify_chain(draft_tokens, num_draft, target_logits, params, offset=None,
                         posterior_threshold=0.09, posterior_alpha=0.3, *, device=H100,
                         adversarial=False):
    """ops.typical_verify_chain's CUDA path, emulated (defaults as the op's)."""
    return _verify(False, draft_tokens, num_draft, None, target_logits, None, params, offset,
                   True, posterior_threshold, posterior_alpha, device, adversarial)


def typical_verify_tree(tree_tokens, parents, target_logits, params, offset=None,
                        posterior_threshold=0.09, posterior_alpha=0.3, *, device=H100,
                        adversarial=False):
    """ops.typical_verify_tree's CUDA path, emulated (defaults as the op's)."""
    return _verify(True, tree_tokens, None, parents, target_logits, None, params, offset, True,
                   posterior_threshold, posterior_alpha, device, adversarial)
