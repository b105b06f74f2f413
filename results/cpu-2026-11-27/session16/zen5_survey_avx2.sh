#!/usr/bin/env bash
# Second part of the Zen 5 survey: the AVX2 path (our kernels and torch's capped) for the main
# job and the file-precision peer run (llama.cpp built for AVX2 only), and the 1.5b shape's
# fp32 cost curve on both paths. Run alone:
#   flock /tmp/specdec-heavy.lock bash results/cpu-2026-11-27/session16/zen5_survey_avx2.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=results/cpu-2026-11-27/session16
export PYTHONPATH=$PWD
LLAMA_AVX2_PY=${LLAMA_AVX2_PY:-/tmp/llama-avx2-venv/bin/python}
stage() { echo "=== $(date -u +%H:%M:%S) $*"; }
stage main job avx2
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 python3 -m specdec_kernels.bench --out $out/main-avx2
stage file precision against llama.cpp, avx2
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 $LLAMA_AVX2_PY -m specdec_kernels.bench --weights file --repeats 3 \
  --methods hf-generate,ours-autoregressive,ours-suffix,ours-multi,ours-token-recycling,llama-cpp,llama-cpp-prompt-lookup \
  --out $out/file-avx2
stage cost curve 1.5b fp32 avx512
python3 -m bench.cost_curve --device cpu --dtype float32 --models 1.5b --tokens 1,2,4,8,16,32 --repeats 5 --out $out/cost-1.5b-fp32-avx512.json
stage cost curve 1.5b fp32 avx2
python3 -m bench.cost_curve --device cpu --dtype float32 --models 1.5b --tokens 1,2,4,8,16,32 --repeats 5 --isa avx2 --out $out/cost-1.5b-fp32-avx2.json
stage done
