#!/usr/bin/env bash
# The panel tiles without VNNI (what an AVX2-only Zen 3 runs): int4's eight vpmaddubsw
# results summed in int16 before one vpmaddwd (working tree) against one vpmaddwd each
# (bbff060). Both binaries time the row layout too, as an anchor; runs alternate. Alone:
#   flock /tmp/specdec-heavy.lock bash results/cpu-2026-11-27/session16/novnni_ab.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/oldh
for f in cpu_qpanel.h cpu_qdot.h cpu_simd.h; do git show bbff060:csrc/$f > /tmp/oldh/$f; done
ti=$(python3 -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])")
flags=(-O3 -std=c++17 -fopenmp -ffp-contract=off -I"$ti")
g++ "${flags[@]}" -I/tmp/oldh bench/kernel_ab/packed_int4.cpp -o /tmp/packed_old
g++ "${flags[@]}" -Icsrc bench/kernel_ab/packed_int4.cpp -o /tmp/packed_new
for round in 1 2; do
  for level in 1 2; do
    for side in old new; do
      echo "--- round $round, $side, level $level, SPECDEC_CPU_VNNI=0"
      SPECDEC_CPU_VNNI=0 /tmp/packed_$side $level
    done
  done
done
