#!/usr/bin/env bash
# The sixteenth session's survey of a new CPU (2-core AMD EPYC, family 26 = Zen 5, AVX-512 with
# VNNI/BF16), run alone under the heavy-job lock:
#   flock /tmp/specdec-heavy.lock bash results/cpu-2026-11-27/session16/zen5_survey.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=results/cpu-2026-11-27/session16
export PYTHONPATH=$PWD
LLAMA_PY=${LLAMA_PY:-/tmp/llama-venv/bin/python}
stage() { echo "=== $(date -u +%H:%M:%S) $*"; }
stage cost curve fp32 avx512
python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --out $out/cost-fp32-avx512.json
stage cost curve fp32 avx2
python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --isa avx2 --out $out/cost-fp32-avx2.json
stage cost curve int4 avx512
python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --out $out/cost-int4-avx512.json
stage cost curve int4 avx2
python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --isa avx2 --out $out/cost-int4-avx2.json
stage main job
python3 -m specdec_kernels.bench --out $out/main
stage file precision against llama.cpp, avx512
$LLAMA_PY -m specdec_kernels.bench --weights file --repeats 3 \
  --methods hf-generate,ours-autoregressive,ours-suffix,ours-multi,ours-token-recycling,llama-cpp,llama-cpp-prompt-lookup \
  --out $out/file-avx512
stage done
