#!/usr/bin/env bash
# old = committed cpu_qpanel.h, new = working tree; alternate binaries.
set -euo pipefail
cd /work/main
mkdir -p /tmp/oldh2
for f in cpu_qpanel.h cpu_qdot.h cpu_simd.h; do git show HEAD:csrc/$f > /tmp/oldh2/$f; done
ti=$(python3 -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])")
flags=(-O3 -std=c++17 -fopenmp -ffp-contract=off -I"$ti")
g++ "${flags[@]}" -I/tmp/oldh2 bench/kernel_ab/packed_int4.cpp -o /tmp/p_old
g++ "${flags[@]}" -Icsrc bench/kernel_ab/packed_int4.cpp -o /tmp/p_new
for round in 1 2; do for level in ${LEVELS:-2 1}; do for side in old new; do
  echo "--- round $round, $side, level $level"; /tmp/p_$side $level | grep -E "M= 1|M= 8|int"
done; done; done
