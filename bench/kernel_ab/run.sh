#!/usr/bin/env bash
# A/B of the CPU tiles (csrc/cpu_qdot.h, csrc/cpu_dot.h): the versions at git revision OLD
# (default HEAD) against the working tree's, in one process (step.h says why), for a decoding
# step's quantized and float linears on each instruction-set level (2 = AVX-512, 1 = AVX2).
#   bash bench/kernel_ab/run.sh [OLD] [LEVEL ...]     e.g. bash bench/kernel_ab/run.sh HEAD~1 2 1
#   KINDS="1" limits the run to the float step (0 = quantized, 1 = float; default both).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
old=${1:-HEAD}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old" "$work/new"
for f in cpu_qdot.h cpu_dot.h cpu_simd.h; do
  git -C "$root" show "$old:csrc/$f" > "$work/old/$f"
  cp "$root/csrc/$f" "$work/new/$f"
done
torch_include=$(python3 -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])")
for side in old new; do
  cat > "$work/$side.cpp" <<CPP
#include "step.h"
#define specdec specdec_$side
#include "$side/cpu_qdot.h"
#include "$side/cpu_dot.h"
#include "quantized_step.inc"
#include "float_step.inc"
ab::Step* ab::make_$side(ab::Kind kind) {
  if (kind == ab::kFloat) return new FloatStep();
  return new QuantizedStep();
}
CPP
done
flags=(-O3 -ffp-contract=off -std=c++17 -fopenmp -I"$here" -I"$torch_include")
for side in old new; do g++ "${flags[@]}" -I"$work" -c "$work/$side.cpp" -o "$work/$side.o"; done
g++ "${flags[@]}" -c "$here/main.cpp" -o "$work/main.o"
g++ -fopenmp "$work/old.o" "$work/new.o" "$work/main.o" -o "$work/ab"
levels=("$@")
[ ${#levels[@]} -gt 0 ] || levels=(2 1)
for kind in ${KINDS:-0 1}; do
  for level in "${levels[@]}"; do "$work/ab" "$kind" "$level"; done
done
