#!/usr/bin/env bash
# After the panel tiles fetch 16 blocks ahead (dd3bfde): the file-precision step cost on both
# paths, the quantized-self draft cost, and the file-precision peer runs. Run alone, from a
# worktree of the commit:
#   flock /tmp/specdec-heavy.lock bash /tmp/bt/results/cpu-2026-11-27/session16/panels16.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=results/cpu-2026-11-27/session16
export PYTHONPATH=$PWD
LLAMA_PY=${LLAMA_PY:-/tmp/llama-venv/bin/python}
LLAMA_AVX2_PY=${LLAMA_AVX2_PY:-/tmp/llama-avx2-venv/bin/python}
METHODS=hf-generate,ours-autoregressive,ours-suffix,ours-multi,ours-token-recycling,llama-cpp
stage() { echo "=== $(date -u +%H:%M:%S) $*"; }
python3 -c "import specdec_kernels; print('package:', specdec_kernels.__file__)"
stage cost curve int4 avx512
python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --tokens 1,2,4,8,16 --out $out/cost-int4-panels16-avx512.json
stage cost curve int4 avx2
python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --tokens 1,2,4,8,16 --isa avx2 --out $out/cost-int4-panels16-avx2.json
stage quantized-self draft cost
python3 -m bench.quantized_cost --prefix 256 --repeats 30 --out $out/quantized-cost-panels16.json
stage file precision against llama.cpp, avx512
$LLAMA_PY -m specdec_kernels.bench --weights file --repeats 3 --methods $METHODS --out $out/file-panels16-avx512
stage file precision against llama.cpp, avx2
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 $LLAMA_AVX2_PY -m specdec_kernels.bench --weights file --repeats 3 \
  --methods $METHODS --out $out/file-panels16-avx2
stage done
