#!/usr/bin/env python3
"""Mutation check of the CUDA emulator's tests: seeded faults in the device code, each of which
the emulated tests (python_tests/test_cuda_emulation*.py) must catch.

For every mutation in MUTATIONS: copy csrc/ to a scratch folder, apply the one edit, build an
emulation library whose translation units that include the edited file (or the mutation's
`units`, when its tests exercise only those) come from the scratch copy and the others from
the object cache (python_tests/emulation.py), load it in this process and run the mutation's
tests on it (pytest, in process) until the first failure. A mutation is caught when a test
fails, missed when they all pass. Prints a table and the catch rate; exits 1 if any mutation
was missed or did not apply (its text no longer matches the sources: update the list).

    python3 scripts/mutation_check.py              # every mutation, a worker per core (CI)
    python3 scripts/mutation_check.py --list
    python3 scripts/mutation_check.py --only shfl-mask tile-edge
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from python_tests import emulation  # noqa: E402

TESTS = "python_tests/test_cuda_emulation.py"
SAMPLING_TESTS = "python_tests/test_cuda_emulation_sampling.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # under csrc/
    find: str  # must occur exactly once
    replace: str
    fault: str  # what it breaks, in words
    tests: tuple[str, ...]  # pytest arguments: the tests that should catch it
    units: tuple[str, ...] = ()  # the units built from the mutant; () = all that include it


def m(name, file, find, replace, fault, *tests, units=()):
    return Mutation(name, file, find, replace, fault, tests, units)


TEAM = "cuda/kernels/team.cuh"
ROW = "cuda/kernels/team_row.cuh"
KERNELS = "cuda/kernels/sampling_kernels.cuh"
MASKS = "cuda/kernels/tree_masks.cuh"
KV = "cuda/kernels/kv_cache.cuh"
ATTENTION = "cuda/kernels/tree_attention.cuh"
# The sample tests alone (with units=SAMPLE_UNIT: only the sample kernel's unit rebuilt), and
# the verification tests (units=VERIFY_UNIT).
SAMPLE_TESTS = (SAMPLING_TESTS, "-k",
                "sample or every_path or bf16 or radix or flat or uniforms or draws")
SAMPLE_UNIT = ("emulate_sample",)
VERIFY_TESTS = (SAMPLING_TESTS, "-k", "verify or chain or tree or edge_cases or filters")
VERIFY_UNIT = ("emulate_verify",)

MUTATIONS = [
    # ---- sampling and verification: barriers
    m("barrier-block-sum", TEAM,
      "  for (int w = 0; w < kTeamWarps; ++w) total += sh.warp_d[w];\n  __syncthreads();\n",
      "  for (int w = 0; w < kTeamWarps; ++w) total += sh.warp_d[w];\n",
      "block_sum_d: the barrier after reading the warps' partial sums removed (the next sum "
      "overwrites them while slower warps still read)", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("barrier-radix-clear", ROW,
      "        for (int k = threadIdx.x; k < kRadixBins; k += kTeamThreads) direct[k] = 0;\n"
      "      }\n      __syncthreads();\n",
      "        for (int k = threadIdx.x; k < kRadixBins; k += kTeamThreads) direct[k] = 0;\n"
      "      }\n",
      "count_radix: the barrier between clearing the histogram and counting into it removed",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("barrier-bitonic", TEAM,
      "        }\n      }\n      __syncthreads();\n    }\n  }\n}",
      "        }\n      }\n    }\n  }\n}",
      "block_sort_u64: the barrier between the bitonic network's stages removed",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("cluster-sync-as-block-sync", TEAM,
      "      cooperative_groups::this_cluster().sync();",
      "      __syncthreads();",
      "Team::sync: a block barrier instead of the cluster barrier for a multi-block team",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("exchange-single-buffer", TEAM,
      "    const int p = phase;\n    phase ^= 1;\n",
      "    const int p = phase;\n",
      "Team::publish: one exchange buffer instead of two (a block overwrites what another block "
      "still reads)", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    # ---- warp collectives
    m("shfl-mask", TEAM,
      "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);",
      "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0x7fffffffu, v, o);",
      "warp_sum_d: a shuffle mask without lane 31", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("shfl-src-lane", ROW,
      "      running += __shfl_sync(kFullMask, inclusive, 31);",
      "      running += __shfl_sync(kFullMask, inclusive, 30);",
      "warp_scan_segment: the running sum taken from lane 30 instead of the last lane",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("shfl-up-lane", TEAM,
      "    const double n = __shfl_up_sync(kFullMask, v, o);\n    if (lane >= o) v += n;",
      "    const double n = __shfl_up_sync(kFullMask, v, o);\n    if (lane > o) v += n;",
      "warp_scan_d: the prefix sum skips the lane exactly `o` up", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("vote-any-as-all", ROW,
      "    const bool warp_bad = __any_sync(kFullMask, bad);",
      "    const bool warp_bad = __all_sync(kFullMask, bad);",
      "pass_max: NaN/+Inf detected only when every lane of a warp sees one", SAMPLING_TESTS,
      "-k", "reports", units=SAMPLE_UNIT),
    # ---- indexing
    m("tile-edge", ROW,
      "    if (x0 + VEC <= vocab) {\n      e.load_global(row + x0);",
      "    if (x0 + VEC <= vocab + 1) {\n      e.load_global(row + x0);",
      "load_row: a vector loaded whole when it ends one element past the row", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("tile-count", ROW,
      "    tiles = (vocab + kTile - 1) / kTile;",
      "    tiles = vocab / kTile;",
      "TeamRow: the row's partial last tile dropped", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("segment-owner", ROW,
      "    return team.of(owner_segment / kTeamWarps, p).i;",
      "    return team.of(owner_segment % team.size, p).i;",
      "segment_draw: the drawn token read from the wrong block of the team", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    # ---- atomics and races
    m("histogram-race", ROW,
      "                atomicAdd(&columns[((key >> (shift + 1)) & 0x7Fu) * 32 + lane],\n"
      "                          ((key >> shift) & 1u) ? 0x10000u : 1u);",
      "                columns[((key >> (shift + 1)) & 0x7Fu) * 32 + lane] +=\n"
      "                    ((key >> shift) & 1u) ? 0x10000u : 1u;",
      "count_radix: the shared histogram columns updated without atomics (warps race on them)",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("list-fill-race", ROW,
      "          const int at = base + atomicAdd(&sh.list_fill, 1);",
      "          const int at = base + sh.list_fill++;",
      "gather_list: the kept list's fill counter incremented without an atomic",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("mass-double-to-float", ROW,
      "    double total = 0.0;\n    for (int k = 0; k < segments; ++k) total += seg_out[k];",
      "    float total = 0.0f;\n    for (int k = 0; k < segments; ++k) total += static_cast<float>(seg_out[k]);",
      "segment_sums: the row's total mass accumulated in float instead of double",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("warp-sum-double-to-float", TEAM,
      "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);\n  return v;",
      "  for (int o = 16; o > 0; o >>= 1) v = static_cast<float>(v + __shfl_xor_sync(kFullMask, v, o));\n  return v;",
      "warp_sum_d: the warp's sums rounded to float", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    # ---- randomness, errors, assembly
    m("philox-offset", KERNELS,
      "row.draw_target(uniforms_at(p.seed, p.offset, 0, kStreamSample).sample)",
      "row.draw_target(uniforms_at(p.seed, p.offset + 1, 0, kStreamSample).sample)",
      "sample_kernel: the Philox offset off by one", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("philox-position", KERNELS,
      "uniforms_at(p.seed, p.offset, static_cast<uint32_t>(j), kStreamVerify).sample;",
      "uniforms_at(p.seed, p.offset, static_cast<uint32_t>(j + 1), kStreamVerify).sample;",
      "decide_node: a typical row's next token drawn with the next position's uniform",
      SAMPLING_TESTS, "-k", "typical", units=VERIFY_UNIT),
    m("last-team-count", KERNELS,
      "is_last = atomicAdd(a.counters + b, 1u) == static_cast<unsigned>(a.rows - 1);",
      "is_last = atomicAdd(a.counters + b, 1u) == 0u;",
      "verify_kernel: the first team of a request to finish assembles it, not the last",
      *VERIFY_TESTS, units=VERIFY_UNIT),
    m("error-max", KERNELS,
      "atomicMin(a.errors + b, static_cast<unsigned long long>(error));",
      "atomicMax(a.errors + b, static_cast<unsigned long long>(error));",
      "verify_kernel: errors combined with max instead of min", SAMPLING_TESTS, "-k",
      "reports", units=VERIFY_UNIT),
    m("table-window-edge", "core/sampling.h",
      "  if (d >= static_cast<uint32_t>(kWeightTableSpan)) return -1;",
      "  if (d > static_cast<uint32_t>(kWeightTableSpan)) return -1;",
      "weight_table_index: the bf16 weight table used one entry past its window (|logit| = 2^8)",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("table-copy-owner", ROW,
      "        if (owner != team.rank) t[k] = team.at(t, owner)[k];",
      "        if (owner != team.rank) t[k] = team.at(t, 0)[k];",
      "ensure_table: every block copies the others' table shares from rank 0",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("radix-last-round", ROW,
      "      radix_pick_top_k(s, sh.counts_total, kZeroMasses, shift, shift == last_shift);",
      "      radix_pick_top_k(s, sh.counts_total, kZeroMasses, shift, shift == last_shift + 8);",
      "count_radix: top-k's radix select stops a round early for half and bf16 logits",
      *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("mass-radix-read-barrier", ROW,
      "      team.sync();  // every block has read the others' histograms (cleared next round)\n",
      "",
      "mass_radix: a block clears its histogram while others still read it", *SAMPLE_TESTS,
      units=SAMPLE_UNIT),
    m("fixed-point-scale", ROW,
      "  const int sh_hi = e - 118;",
      "  const int sh_hi = e - 119;",
      "fixed_point: the high word of a weight's fixed-point mass halved", *SAMPLE_TESTS,
      units=SAMPLE_UNIT),
    m("gather-list-base", ROW,
      "      if (r < team.rank) base += n;",
      "      if (r <= team.rank) base += n;",
      "gather_list: a block's kept tokens placed after its own count too", *SAMPLE_TESTS,
      units=SAMPLE_UNIT),
    m("draw-boundary", ROW,
      "          if (hit < 0 && w[i] > 0.0f && static_cast<float>(cumulative) > target) hit = i;",
      "          if (hit < 0 && w[i] > 0.0f && static_cast<float>(cumulative) >= target) hit = i;",
      "warp_scan_segment: a draw whose target equals a cumulative weight takes that token "
      "(the rule: the first cumulative weight above the target)", *SAMPLE_TESTS,
      units=SAMPLE_UNIT),
    m("list-draw-boundary", ROW,
      "      const int hit = block_min_i(w > 0.0f && static_cast<float>(cumulative) > target ? q : INT32_MAX, sh);",
      "      const int hit = block_min_i(w > 0.0f && static_cast<float>(cumulative) >= target ? q : INT32_MAX, sh);",
      "list_draw: the same boundary error on the kept list", *SAMPLE_TESTS, units=SAMPLE_UNIT),
    m("child-token-check", KERNELS,
      "    if (x < 0 || x >= a.vocab)\n      error = min_code(error, encode_error(kErrDraftToken, kTree ? c : c - 1));",
      "    if (x < -1000000 || x >= a.vocab + 1000000)\n      error = min_code(error, encode_error(kErrDraftToken, kTree ? c : c - 1));",
      "node_input_error: a node team reads its children's probabilities at out-of-range "
      "draft tokens", SAMPLING_TESTS, "-k", "reports", units=VERIFY_UNIT),
    # ---- mask builders
    m("scan-reuse-barrier", MASKS,
      "  __syncthreads();  // scratch may be reused by the caller's next scan\n", "",
      "block_exclusive_scan: the barrier before the scratch is reused removed", TESTS, "-k",
      "tree_masks"),
    m("scan-lane", MASKS,
      "    if (lane >= offset) inclusive += up;",
      "    if (lane > offset) inclusive += up;",
      "block_exclusive_scan: the warp scan skips the lane exactly `offset` up", TESTS, "-k",
      "tree_masks"),
    m("has-child-barrier", MASKS,
      "    if (p >= 0 && p < j) child[p] = 1;  // benign race: every writer stores 1\n  }\n"
      "  __syncthreads();\n",
      "    if (p >= 0 && p < j) child[p] = 1;  // benign race: every writer stores 1\n  }\n",
      "build_tree_masks_kernel: leaves found before every child flag is written", TESTS, "-k",
      "tree_masks"),
    m("lookahead-bound", MASKS,
      "  if (i >= batch * num_rows) return;",
      "  if (i > batch * num_rows) return;",
      "build_lookahead_masks_kernel: one thread past the last window row writes", TESTS, "-k",
      "lookahead"),
    # ---- KV cache
    m("rollback-ballot-mask", KV,
      "    const unsigned mask = __ballot_sync(0xffffffffu, frees);",
      "    const unsigned mask = __ballot_sync(0xfffffffeu, frees);",
      "rollback_paged_kernel: a ballot mask without lane 0", TESTS, "-k", "rollback"),
    m("rollback-slot", KV,
      "    const int64_t slot = written + __popc(mask & ((1u << lane) - 1u));",
      "    const int64_t slot = written + __popc(mask & (1u << lane));",
      "rollback_paged_kernel: a freed block's slot counts itself", TESTS, "-k", "rollback"),
    m("compact-gather-barrier", KV,
      "      staging[k] = reinterpret_cast<const vec_t*>(base + rows.offset(b, h, positions[i]))[v];\n"
      "  }\n  __syncthreads();\n",
      "      staging[k] = reinterpret_cast<const vec_t*>(base + rows.offset(b, h, positions[i]))[v];\n"
      "  }\n",
      "compact_kv_rows_kernel: rows scattered before every overlapping source is gathered",
      TESTS, "-k", "compact"),
    m("tree-position-padding", MASKS,
      "    position_ids[b * num_nodes + j] = prefix + (d > 0 ? d : 0);",
      "    position_ids[b * num_nodes + j] = prefix + d;",
      "build_tree_masks_kernel: padding nodes' positions one before the prefix end", TESTS,
      "-k", "tree_masks"),
    m("compact-destination-check", KV,
      "    if (i < n && rows.valid(b, positions[i]) && rows.valid(b, dst))",
      "    if (i < n && rows.valid(b, positions[i]))",
      "compact_kv_columns_kernel: rows written past the cache when lengths are unchecked",
      TESTS, "-k", "compact"),
    m("advance-lens-bound", KV,
      "  if (b < batch) cache_lens[b] += num_accepted[b];",
      "  if (b <= batch) cache_lens[b] += num_accepted[b];",
      "advance_cache_lens_kernel: one thread past the batch writes", TESTS, "-k", "compact"),
    # ---- tree attention
    m("attention-refill-barrier", ATTENTION,
      "    __syncthreads();  // every warp is done with this stage before it is refilled\n", "",
      "tree_attention_mma_kernel: a K/V stage refilled while other warps still read it", TESTS,
      "-k", "tensor_core"),
    m("attention-cp-async-wait", ATTENTION,
      "      cp_async_wait<1>();  // everything but the tile just issued has landed",
      "      cp_async_wait<2>();  // everything but the tile just issued has landed",
      "tree_attention_mma_kernel: the wait lets the tile about to be used still be in flight",
      TESTS, "-k", "tensor_core"),
    m("attention-combine-last-split", ATTENTION,
      "  for (int64_t s = 0; s < used; ++s) total += exp2f(lse[s] - top);",
      "  for (int64_t s = 0; s + 1 < used; ++s) total += exp2f(lse[s] - top);",
      "tree_attention_combine_kernel: the last split left out of the normaliser", TESTS, "-k",
      "tensor_core or simt"),
    m("attention-prefix-edge", ATTENTION,
      "              if (!(i < end && (i < tree || tree_mask_bit(mask_row, i - tree)))) x = -INFINITY;",
      "              if (!(i < end && (i <= tree || tree_mask_bit(mask_row, i - tree)))) x = -INFINITY;",
      "tree_attention_mma_kernel: the first tree key seen by every row as if in the prefix",
      TESTS, "-k", "tensor_core or masks"),
]


def apply(mutation: Mutation, csrc: Path) -> str | None:
    """Applies the mutation to the copy `csrc`; returns why it cannot, or None."""
    path = csrc / mutation.file
    text = path.read_text()
    count = text.count(mutation.find)
    if count != 1:
        return f"its text occurs {count} times in csrc/{mutation.file} (must be once)"
    path.write_text(text.replace(mutation.find, mutation.replace))
    return None


def units_including(csrc: Path, file: str) -> tuple[str, ...]:
    """The emulation library's translation units whose sources include csrc/`file`."""
    found = []
    for unit in sorted((csrc / emulation.EMULATION).glob("emulate_*.cpp")):
        files: set[Path] = set()
        emulation._includes(csrc, unit.relative_to(csrc), files)
        if Path(file) in files:
            found.append(unit.stem)
    return tuple(found)


class FirstFailure:
    """pytest plugin: the first failing test and its error line."""

    def __init__(self):
        self.test = self.error = ""

    def pytest_runtest_logreport(self, report):
        if report.failed and not self.test:
            self.test = report.nodeid.split("::")[-1]
            lines = [line[1:].strip() for line in report.longreprtext.splitlines()
                     if line.startswith("E ")]
            self.error = next((x for x in lines if "Error" in x), lines[0] if lines else "")


def run(mutation: Mutation, scratch: Path) -> tuple[str, str, float]:
    """(outcome, detail, seconds) of one mutation: caught, MISSED, NOT APPLIED, BUILD FAILED."""
    start = time.time()
    original = (scratch / mutation.file).read_text()
    try:
        problem = apply(mutation, scratch)
        if problem:
            return "NOT APPLIED", problem, time.time() - start
        units = mutation.units or units_including(scratch, mutation.file)
        try:
            path, _ = emulation.build(emulation.CSRC, emulation.CACHE, variant=scratch,
                                      variant_units=units)
        except RuntimeError as e:
            return "BUILD FAILED", str(e).splitlines()[-1][:120], time.time() - start
        emulation._library = emulation.load(path)
        failure = FirstFailure()
        with contextlib.redirect_stdout(io.StringIO()):
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o",
                                "addopts=", *mutation.tests], plugins=[failure])
        if code == pytest.ExitCode.OK:
            return "MISSED", "every selected test passed", time.time() - start
        if not failure.test:
            return "NOT RUN", f"pytest exit code {code}", time.time() - start
        return "caught", f"{failure.test}: {failure.error[:160]}", time.time() - start
    finally:
        (scratch / mutation.file).write_text(original)


_scratch: Path | None = None  # a worker's copy of csrc


def start_worker(root: str) -> None:
    """A worker process: its own copy of csrc to mutate (one mutation at a time)."""
    global _scratch
    torch.set_num_threads(1)
    _scratch = Path(tempfile.mkdtemp(prefix="specdec-mutants-", dir=root)) / "csrc"
    shutil.copytree(ROOT / "csrc", _scratch)


def run_in_worker(name: str) -> tuple[str, str, str, float]:
    mutation = next(x for x in MUTATIONS if x.name == name)
    return (name, *run(mutation, _scratch))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutation names to run")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: one per core)")
    args = parser.parse_args()
    chosen = [x for x in MUTATIONS if not args.only or x.name in args.only]
    if args.list or not chosen:
        for x in MUTATIONS:
            print(f"{x.name:32} csrc/{x.file}: {x.fault}")
        return 0 if args.list else 2
    if emulation.library() is None:  # also builds the unmutated objects the workers reuse
        print(f"mutation check skipped: {emulation.UNAVAILABLE}")
        return 0
    start = time.time()
    results = {}
    with tempfile.TemporaryDirectory() as root:
        context = multiprocessing.get_context("spawn")
        with context.Pool(min(args.jobs, len(chosen)), start_worker, (root,)) as pool:
            for name, outcome, detail, seconds in pool.imap_unordered(
                    run_in_worker, [x.name for x in chosen]):
                results[name] = (outcome, detail)
                print(f"{outcome:12} {seconds:6.1f} s  {name}: {detail}", flush=True)
    caught = sum(outcome == "caught" for outcome, _ in results.values())
    print("\n| mutation | fault | outcome | caught by |\n|---|---|---|---|")
    for x in chosen:
        outcome, detail = results[x.name]
        print(f"| {x.name} | {x.fault} | {outcome} | {detail} |")
    print(f"\ncaught {caught} of {len(chosen)} mutations ({100 * caught / len(chosen):.0f}%) in "
          f"{time.time() - start:.0f} s with {min(args.jobs, len(chosen))} workers")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
