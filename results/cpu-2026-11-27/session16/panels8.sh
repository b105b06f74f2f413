#!/usr/bin/env bash
# After the int8 panels (bbff060): the file-precision step cost and peer runs against llama.cpp
# on both paths, the quantized-self draft cost. Run alone, from a worktree of the commit (a
# benchmark must not import a tree being edited):
#   git worktree add --detach /tmp/bt bbff060 && cd /tmp/bt && python3 setup.py build_ext --inplace
#   flock /tmp/specdec-heavy.lock bash /tmp/bt/results/cpu-2026-11-27/session16/panels8.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=results/cpu-2026-11-27/session16
export PYTHONPATH=$PWD
LLAMA_PY=${LLAMA_PY:-/tmp/llama-venv/bin/python}
LLAMA_AVX2_PY=${LLAMA_AVX2_PY:-/tmp/llama-avx2-venv/bin/python}
METHODS=hf-generate,ours-autoregressive,ours-suffix,ours-multi,ours-token-recycling,ours-quantized-self,llama-cpp,llama-cpp-prompt-lookup
stage() { echo "=== $(date -u +%H:%M:%S) $*"; }
python3 -c "import specdec_kernels; print('package:', specdec_kernels.__file__)"
stage quantized-self draft cost
python3 -m bench.quantized_cost --prefix 256 --repeats 30 --out $out/quantized-cost-int8-panels.json
stage file precision against llama.cpp, avx512
$LLAMA_PY -m specdec_kernels.bench --weights file --repeats 3 --methods $METHODS --out $out/file-panels8-avx512
stage file precision against llama.cpp, avx2
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 $LLAMA_AVX2_PY -m specdec_kernels.bench --weights file --repeats 3 \
  --methods $METHODS --out $out/file-panels8-avx2
stage done
