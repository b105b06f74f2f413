#!/usr/bin/env bash
# Compile-checks every csrc/cuda/*.cu with nvcc against the installed torch's headers (no GPU
# and no CUDA build of torch needed). Fails on any error or warning.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || { echo "nvcc not found"; exit 1; }
command -v cmake >/dev/null || python3 -m pip install -q cmake
mkdir -p build
cmake -S . -B build/cmake -DCMAKE_BUILD_TYPE=Release >build/cmake-configure.log 2>&1 \
  || { cat build/cmake-configure.log; exit 1; }
cmake --build build/cmake --target cuda_compile_check -j "${MAX_JOBS:-2}"
echo "nvcc compile check passed: $(ls csrc/cuda/*.cu | wc -l) files"
