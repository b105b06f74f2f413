#!/usr/bin/env bash
# A/B of csrc/cpu_qdot.h: the version at git revision OLD (default HEAD) against the working
# tree's, in one process (step.h says why).
#   bash bench/kernel_ab/run.sh [OLD] [LEVEL ...]     e.g. bash bench/kernel_ab/run.sh HEAD~1 2 1
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
old=${1:-HEAD}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old" "$work/new"
for f in cpu_qdot.h cpu_simd.h; do
  git -C "$root" show "$old:csrc/$f" > "$work/old/$f"
  cp "$root/csrc/$f" "$work/new/$f"
done
torch_include=$(python3 -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])")
for side in old new; do
  printf '#include "step.h"\n#define specdec specdec_%s\n#include "%s/cpu_qdot.h"\n#include "step_impl.inc"\nab::Step* ab::make_%s() { return new StepImpl(); }\n' \
    "$side" "$side" "$side" > "$work/$side.cpp"
done
flags=(-O3 -ffp-contract=off -std=c++17 -fopenmp -I"$here" -I"$torch_include")
for side in old new; do g++ "${flags[@]}" -I"$work" -c "$work/$side.cpp" -o "$work/$side.o"; done
g++ "${flags[@]}" -c "$here/main.cpp" -o "$work/main.o"
g++ -fopenmp "$work/old.o" "$work/new.o" "$work/main.o" -o "$work/ab"
levels=("$@")
[ ${#levels[@]} -gt 0 ] || levels=(2 1)
for level in "${levels[@]}"; do "$work/ab" "$level"; done
