#!/usr/bin/env bash
# After the int4 panel layout (csrc/cpu_qpanel.h): the format A/B, the file-precision step
# cost, the file-precision peer run against llama.cpp on both paths, the main job on both
# paths, and the quantized-self draft cost. Run alone:
#   flock /tmp/specdec-heavy.lock bash results/cpu-2026-11-27/session16/panels.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=results/cpu-2026-11-27/session16
export PYTHONPATH=$PWD
LLAMA_PY=${LLAMA_PY:-/tmp/llama-venv/bin/python}
LLAMA_AVX2_PY=${LLAMA_AVX2_PY:-/tmp/llama-avx2-venv/bin/python}
METHODS=hf-generate,ours-autoregressive,ours-suffix,ours-multi,ours-token-recycling,ours-quantized-self,llama-cpp,llama-cpp-prompt-lookup
stage() { echo "=== $(date -u +%H:%M:%S) $*"; }
stage format A/B
torch_include=$(python3 -c "import torch.utils.cpp_extension as c; print(c.include_paths()[0])")
g++ -O3 -std=c++17 -fopenmp -ffp-contract=off -I"$torch_include" -Icsrc bench/kernel_ab/packed_int4.cpp -o /tmp/packed
/tmp/packed 2 | tee $out/format-ab-avx512.txt
/tmp/packed 1 | tee $out/format-ab-avx2.txt
stage cost curve int4 panels avx512
python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --out $out/cost-int4-panels-avx512.json
stage cost curve int4 panels avx2
python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --isa avx2 --out $out/cost-int4-panels-avx2.json
stage quantized-self draft cost
python3 -m bench.quantized_cost --prefix 256 --repeats 30 --out $out/quantized-cost.json
stage file precision against llama.cpp, avx512
$LLAMA_PY -m specdec_kernels.bench --weights file --repeats 3 --methods $METHODS --out $out/file-panels-avx512
stage file precision against llama.cpp, avx2
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 $LLAMA_AVX2_PY -m specdec_kernels.bench --weights file --repeats 3 \
  --methods $METHODS --out $out/file-panels-avx2
stage main job avx512
python3 -m specdec_kernels.bench --out $out/main-panels
stage main job avx2
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 python3 -m specdec_kernels.bench --out $out/main-panels-avx2
stage done
