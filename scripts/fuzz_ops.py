#!/usr/bin/env python3
"""Malformed input to every CPU op of ``torch.ops.specdec``, called raw (the registered op, not
the Python wrapper: engines call them so): a call may raise, never crash, hang or read past
its tensors.

Each op starts from the valid arguments its opcheck test uses (python_tests/), and every case
changes one argument, or one element of a list argument: another dtype, a dimension dropped,
added, shrunk, grown, emptied or tripled, a strided or transposed view, a scalar, ``None``,
index tensors filled with -1, -7, 10**6 or their type's maximum, floats filled with NaN, inf
or 1e30, ints set to -1, 0, 2**31, 10**12. The cases of one op run in a child process (12 GiB
address space) that logs each case before calling it, so a child that dies names the case;
a case that runs past 120 s counts as a hang. A child per core at a time. Prints one line per op (cases, raised, accepted)
and every crash or hang; exits 1 if there was one.

``--emulated`` runs the CUDA kernels instead, in the emulator of python_tests/emulation.py
(guard zones around every buffer, shared-memory race checks), with other *values* only (the
same shapes and dtypes): the CUDA launchers check shapes on the host but, to avoid a device
sync, not the values of lengths, indices, parents or sampling parameters, so the kernels must
stay inside their buffers whatever those hold. A guard-zone touch or a race counts as a crash.

Accepted is not wrong by itself (a NaN logit, a fill of valid indices); ``--accepted`` lists
those cases to read through. (2026-11-27: 4,345 cases, no crash or hang; reading the accepted
ones found tree attention taking a mask's padding bits as nodes, a cache length near the int64
maximum wrapping past its bound check (and build_tree_masks' positions likewise), and
decoder_stack_ ignoring num_heads: all fixed.)

    python3 scripts/fuzz_ops.py                 # every op, ~40 s on 2 cores
    python3 scripts/fuzz_ops.py --only tree_attention --accepted
    python3 scripts/fuzz_ops.py --emulated      # the CUDA kernels' values, ~35 s
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import specdec_kernels  # noqa: E402,F401  (registers the ops)

CASE_TIMEOUT_S = 120
INDEX_FILLS = (-1, -7, 10**6, 1, 0)
FLOAT_FILLS = (float("nan"), float("inf"), -float("inf"), 0.0)
INT_VALUES = (-1, 0, 1, 2**31, 10**12, -(2**40))
FLOAT_VALUES = (float("nan"), float("inf"), -1.0, 0.0, 1e30)
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool)


def samples() -> list:
    """``(op, args)``: valid calls of every CPU op, built as the opcheck tests build them."""
    from python_tests import sampling_cases as cases
    from python_tests.test_decoder_stack import stack_operands
    from python_tests.test_kv_cache import opcheck_samples
    from python_tests.test_quantized_linear import operands as quantized_operands
    from python_tests.test_quantized_panels import kquant_weight, panel_operands
    from python_tests.test_tree import random_parents
    from python_tests.test_tree_attention import make_case
    from python_tests.test_verify import verify_samples
    from specdec_kernels.models.quantized_weight import pack_panels
    from specdec_kernels.tree import stack_trees, tree_from_parents

    ops = torch.ops.specdec
    gen = torch.Generator().manual_seed(0)
    out = list(opcheck_samples("cpu")) + list(verify_samples("cpu"))
    sampled = (cases.random_logits((5, 37), torch.float16, gen),
               *cases.random_params(5, gen).tensors(), torch.arange(5))
    out += [(ops.sample.default, sampled), (ops.sample_with_probs.default, sampled)]
    attention = make_case(gen, "cpu", torch.float16, batch=2, tokens=5, q_heads=4, kv_heads=2,
                          head_dim=64, cache_lens=[3, 11])
    out.append((ops.tree_attention.default, (*attention, 0.125)))
    # One token after a long prefix: the path that splits keys and head dims over threads.
    decoding = make_case(gen, "cpu", torch.float32, batch=1, tokens=1, q_heads=9, kv_heads=3,
                         head_dim=64, cache_lens=[700])
    out.append((ops.tree_attention.default, (*decoding, 0.125)))
    _, parents = stack_trees([tree_from_parents(random_parents(n, gen)) for n in (9, 4, 40)])
    out.append((ops.build_tree_masks.default, (parents, torch.tensor([3, 0, 7]))))
    out.append((ops.build_lookahead_masks.default,
                (torch.tensor([3, 5, 1]), torch.tensor([4, 2, 1]), 9, 11)))
    out.append((ops.quantized_linear.default, quantized_operands(3, 10, 96, 4, 32, gen, bias=True)))
    x, q, s, _, _ = quantized_operands(3, 10, 48, 8, 16, gen)
    out.append((ops.quantized_linear.default, (x, q, s, None, None)))
    x, q, s, mins, _ = quantized_operands(1, 37, 576, 4, 32, gen, scale_dtype=torch.float16)
    out.append((ops.quantized_linear.default, (x, q, s, mins, None)))  # one row, fp16 scales
    x, _, panels, b = panel_operands(5, 48, 96, gen, bias=True)
    out.append((ops.quantized_linear.default, (x, *panels, b)))  # int4 panels
    x, _, panels, _ = panel_operands(3, 32, 64, gen, bits=8, mins=False)
    out.append((ops.quantized_linear.default, (x, *panels, None)))  # int8 panels
    kquant = pack_panels(kquant_weight(32, 512, gen, bits=4, group=32))
    out.append((ops.quantized_linear.default,  # int4 panels, K-quant scales as the file's
                (torch.randn(2, 512, generator=gen), kquant.qweight, kquant.scales, kquant.mins, None)))
    kquant = pack_panels(kquant_weight(16, 256, gen, bits=8, group=16))
    out.append((ops.quantized_linear.default,  # int8 groups of 16 (Q6_K), K-quant scales
                (torch.randn(3, 256, generator=gen), kquant.qweight, kquant.scales, None, None)))
    x, norm = torch.randn(3, 40, generator=gen), torch.rand(40, generator=gen) + 0.5
    out.append((ops.small_batch_linear.default,
                (x, torch.randn(7, 40, generator=gen), torch.randn(7, generator=gen))))
    out.append((ops.small_batch_linear.default,  # one bfloat16 row
                (torch.randn(1, 70, generator=gen).bfloat16(),
                 torch.randn(19, 70, generator=gen).bfloat16(), None)))
    out.append((ops.rms_norm.default, (x, norm, 1e-6)))
    out.append((ops.add_rms_norm.default, (x, x.clone(), norm, 1e-6)))
    out.append((ops.silu_mul.default, (x, x.clone())))
    out.append((ops.rotary_embedding.default, (torch.randn(2, 3, 4, 8, generator=gen),
                                               torch.rand(2, 3, 8, generator=gen),
                                               torch.rand(2, 3, 8, generator=gen))))
    for quantized in (False, True):
        a = stack_operands(gen, joined=quantized, quantized=quantized, ragged=True)
        out.append((ops.decoder_stack_.default,
                    (a["hidden"], a["cos"], a["sin"], a["kv_cache"], a["write_start"],
                     a["write_index"], a["kv_len"], a["cache_lens"], a["tree_mask"], a["norms"],
                     a["linears"], a["num_heads"], a["num_kv_heads"], a["scale"], a["eps"], [1, 0])))
    return out


def emulated_call(name: str):
    """``fn(*args)``: the CUDA kernels of op ``name``, run by the emulator (python_tests/
    emulation.py: guard zones around every buffer, shared-memory race checks) on the op's
    arguments, or None for an op without CUDA kernels of its own."""
    from types import SimpleNamespace

    from python_tests import emulation as emu

    def params(temperature, top_k, top_p, min_p, seed):
        return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                               seed=seed)

    calls = {
        "tree_attention": lambda q, k, v, lens, mask, scale: emu.tree_attention(q, k, v, lens, mask, scale),
        "compact_kv_cache_": lambda caches, lens, positions, counts: emu.compact(
            caches, lens, positions, counts),
        "compact_paged_kv_cache_": lambda caches, tables, lens, positions, counts: emu.compact(
            caches, lens, positions, counts, tables),
        "rollback_paged_kv_cache_": emu.rollback,
        "build_tree_masks": emu.build_tree_masks,
        "build_lookahead_masks": emu.build_lookahead_masks,
        "sample": lambda logits, *p: emu.sample(logits, params(*p[:5]), p[5]),
        "sample_with_probs": lambda logits, *p: emu.sample_with_probs(logits, params(*p[:5]), p[5]),
        "verify_chain": lambda drafts, num, logits, probs, *p: emu.verify_chain(
            drafts, num, logits, probs, params(*p[:5]), p[5]),
        "verify_tree": lambda tokens, parents, logits, probs, *p: emu.verify_tree(
            tokens, parents, logits, probs, params(*p[:5]), p[5]),
        "typical_verify_chain": lambda drafts, num, logits, *p: emu.typical_verify_chain(
            drafts, num, logits, params(*p[:5]), p[5], p[6], p[7]),
        "typical_verify_tree": lambda tokens, parents, logits, *p: emu.typical_verify_tree(
            tokens, parents, logits, params(*p[:5]), p[5], p[6], p[7]),
    }
    return calls.get(name)


def value_variants(t) -> list:
    """``(label, tensor)``: ``t`` with other values, same shape and dtype (what a CUDA launcher
    does not read on the host: the kernels must keep inside their buffers whatever it holds)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return []
    out = []
    if t.dtype in (torch.int32, torch.int64):
        for value in INDEX_FILLS + (torch.iinfo(t.dtype).max, torch.iinfo(t.dtype).min):
            out.append((f"fill {value}", torch.full_like(t, value)))
        for where, value in ((-1, -3), (0, 10**5)):
            changed = t.clone().reshape(-1)
            changed[where] = value
            out.append((f"element {where} = {value}", changed.reshape(t.shape)))
    elif t.dtype.is_floating_point:
        out += [(f"fill {value}", torch.full_like(t, value))
                for value in FLOAT_FILLS + (torch.finfo(t.dtype).max,)]
    return out


#: What the emulator reports when a kernel leaves its buffers or races (python_tests/emulation.py).
EMULATOR_FAULTS = ("out of bounds", "race", "outside", "divergent", "barrier", "aligned")


def tensor_variants(t: torch.Tensor) -> list:
    """``(label, tensor)``: malformed versions of ``t``."""
    out = [(f"dtype {dtype}", t.to(dtype)) for dtype in DTYPES if dtype != t.dtype]
    out.append(("unsqueeze(0)", t.unsqueeze(0)))
    if t.dim() >= 1:
        out += [("[..., 0]", t[..., 0]), ("flatten", t.reshape(-1))]
    for d in range(t.dim()):
        n = t.shape[d]
        if n > 0:
            out += [(f"dim{d} -1", t.narrow(d, 0, n - 1)), (f"dim{d} 0", t.narrow(d, 0, 0)),
                    (f"dim{d} +1", torch.cat([t, t.narrow(d, 0, 1)], d))]
        out.append((f"dim{d} x3", torch.cat([t, t, t], d)))
    if t.numel() > 0:
        out.append(("strided", torch.stack([t, t], -1)[..., 0]))
        out.append(("scalar", t.reshape(-1)[0].clone()))
    if t.dim() >= 2:
        out.append(("transposed", t.transpose(-1, -2).contiguous().transpose(-1, -2)))
    if t.dtype in (torch.int32, torch.int64):
        for value in INDEX_FILLS + (torch.iinfo(t.dtype).max,):
            out.append((f"fill {value}", torch.full_like(t, value)))
        if t.numel() > 0:
            for where, value in ((-1, -3), (0, 10**5)):
                changed = t.clone().reshape(-1)
                changed[where] = value
                out.append((f"element {where} = {value}", changed.reshape(t.shape)))
    elif t.dtype.is_floating_point:
        big = torch.finfo(t.dtype).max
        out += [(f"fill {value}", torch.full_like(t, value)) for value in FLOAT_FILLS + (big,)]
    elif t.dtype == torch.uint8:
        out.append(("fill 255", torch.full_like(t, 255)))
    return out


def scalar_variants(value) -> list:
    if isinstance(value, bool):
        return [("not", not value)]
    if isinstance(value, int):
        return [(str(v), v) for v in INT_VALUES]
    if isinstance(value, float):
        return [(str(v), v) for v in FLOAT_VALUES]
    return []


def argument_variants(value) -> list:
    if isinstance(value, torch.Tensor):
        return tensor_variants(value) + [("None", None)]
    if value is None:
        return [("a tensor", torch.zeros(3))]
    return scalar_variants(value)


def one_changed(args: tuple, variants, list_lengths: bool) -> list:
    """``(label, args)``: copies of ``args`` with one argument, or one of the first 8 elements
    of a list argument, replaced by each of ``variants(value)``; ``list_lengths``: lists also
    emptied and shortened by one."""
    out = []
    for i, arg in enumerate(args):
        def put(value, i=i):
            return args[:i] + (value,) + args[i + 1:]
        if not isinstance(arg, (list, tuple)):
            out += [(f"arg{i} {label}", put(value)) for label, value in variants(arg)]
            continue
        if list_lengths:
            out.append((f"arg{i} = []", put(type(arg)())))
            if arg:
                out.append((f"arg{i} without its last", put(type(arg)(arg[:-1]))))
        for j, element in enumerate(arg[:8]):
            for label, value in variants(element):
                changed = list(arg)
                changed[j] = value
                out.append((f"arg{i}[{j}] {label}", put(type(arg)(changed))))
    return out


def copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(copied(v) for v in value)
    return value


def op_name(op) -> str:
    return str(op).removeprefix("specdec.").removesuffix(".default")


def cases_of(args, emulated: bool) -> list:
    """The calls to make: other values only for the emulated CUDA kernels (their launchers
    check shapes on the host), any change for the CPU ops."""
    if emulated:
        return one_changed(tuple(args), value_variants, list_lengths=False)
    return one_changed(tuple(args), argument_variants, list_lengths=True)


def run_child(which: int, start: int, log: Path, emulated: bool) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))
    torch.set_num_threads(1)  # children run side by side, one per core
    op, args = samples()[which]
    cases = cases_of(args, emulated)
    if emulated:
        op = emulated_call(op_name(op))
    with log.open("a") as out:
        for index in range(start, len(cases)):
            label, case = cases[index]
            out.write(json.dumps({"case": index, "label": label}) + "\n")
            out.flush()
            signal.alarm(CASE_TIMEOUT_S)  # a call that hangs kills the child (SIG_DFL)
            try:
                op(*copied(case))
                result = "accepted"
            except (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError,
                    MemoryError) as error:
                result = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
                if emulated and any(fault in str(error) for fault in EMULATOR_FAULTS):
                    result = "FAULT " + result
            signal.alarm(0)
            out.write(json.dumps({"case": index, "label": label, "result": result}) + "\n")
            out.flush()


def fuzz_op(which: int, op, args, folder: Path, emulated: bool) -> tuple:
    """``(cases, raised, accepted labels, failures)`` of one op's malformed calls."""
    log = folder / f"{which:02d}.jsonl"
    log.touch()
    total = len(cases_of(args, emulated))
    failures, start = [], 0
    while start < total:
        command = [sys.executable, __file__, "--child", str(which), str(start), str(log)]
        child = subprocess.Popen(command + (["--emulated"] if emulated else []),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = child.communicate()
        if child.returncode == 0:
            break
        entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if not entries or "result" in entries[-1]:
            failures.append(("?", child.returncode, err.decode(errors="replace")[-300:]))
            break
        failures.append((entries[-1]["label"], child.returncode, err.decode(errors="replace")[-300:]))
        start = entries[-1]["case"] + 1
    done = [e for e in map(json.loads, log.read_text().splitlines()) if "result" in e]
    accepted = [e["label"] for e in done if e["result"] == "accepted"]
    failures += [(e["label"], "fault", e["result"]) for e in done if e["result"].startswith("FAULT")]
    return total, len(done) - len(accepted), accepted, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="ops whose name contains one of these")
    parser.add_argument("--accepted", action="store_true", help="list the accepted cases")
    parser.add_argument("--emulated", action="store_true",
                        help="the CUDA kernels in the emulator, with other values only")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        run_child(int(options.child[0]), int(options.child[1]), Path(options.child[2]),
                  options.emulated)
        return 0
    if options.emulated:
        from python_tests import emulation

        if emulation.library() is None:  # built once here, before the children load it
            print(f"no emulator: {emulation.UNAVAILABLE}")
            return 1
    chosen = []
    for which, (op, args) in enumerate(samples()):
        name = op_name(op)
        if options.emulated and emulated_call(name) is None:
            continue
        if not options.only or any(part in name for part in options.only):
            chosen.append((which, name, op, args))
    failures = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        results = pool.map(lambda c: fuzz_op(c[0], c[2], c[3], Path(folder), options.emulated), chosen)
        for (which, name, _, _), (total, raised, accepted, failed) in zip(chosen, results):
            print(f"{which:2d} {name:26s} cases {total:4d}  raised {raised:4d}  accepted "
                  f"{len(accepted):4d}  crashed or hung {len(failed)}", flush=True)
            if options.accepted:
                print("   accepted:", "; ".join(accepted))
            failures += [(name, *f) for f in failed]
    print(f"{len(chosen)} sample calls of {len({c[1] for c in chosen})} ops in {time.perf_counter() - start:.0f} s")
    for name, label, code, err in failures:
        print(f"FAILED {name}: {label} (exit {code})\n{err}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
