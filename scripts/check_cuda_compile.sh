#!/usr/bin/env bash
# Compile-checks every csrc/cuda/*.cu with nvcc against the installed torch's headers (no GPU
# and no CUDA build of torch needed), then links the objects together. Fails on any error or
# warning.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || { echo "nvcc not found"; exit 1; }
command -v cmake >/dev/null || python3 -m pip install -q cmake
mkdir -p build
cmake -S . -B build/cmake -DCMAKE_BUILD_TYPE=Release >build/cmake-configure.log 2>&1 \
  || { cat build/cmake-configure.log; exit 1; }
cmake --build build/cmake --target cuda_compile_check -j "${MAX_JOBS:-2}"
# The objects linked together (relocatable, so torch's symbols may stay undefined): a function
# defined in a header that several launchers include would be defined twice in _C.so, which
# only the GPU build's link would otherwise find.
objects=$(for src in csrc/cuda/*.cu; do echo "build/cmake/cuda_check/$(basename "${src%.cu}").o"; done)
# shellcheck disable=SC2086
ld -r -o build/cmake/cuda_check_linked.o $objects \
  || { echo "the compiled CUDA sources do not link together (see above)"; exit 1; }
echo "nvcc compile check passed: $(ls csrc/cuda/*.cu | wc -l) files, linked together"
