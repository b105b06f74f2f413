# File precision (the GGUF's own weights), llama.cpp beside us (llama-cpp-python built from source
# in /tmp/llama-venv, native; /tmp/llama-avx2-venv, AVX2 only), both paths, alone.
set -u
# OUT_DIR: where the outputs go (default: this folder; later sessions point it at theirs).
out=${OUT_DIR:-/work/main/results/cpu-2026-12-04/session24}
M="hf-generate,ours-autoregressive,ours-suffix,ours-multi,ours-token-recycling,llama-cpp,llama-cpp-prompt-lookup"
A="--weights file --methods $M --prompts-per-category 2 --max-new-tokens 96"
AV2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
cd /work/main
if [ "${1:-avx512}" = avx512 ]; then
  echo "=== $(date -u +%H:%M:%S) file precision avx512"
  /tmp/llama-venv/bin/python -m specdec_kernels.bench $A --out $out/file-avx512
else
  echo "=== $(date -u +%H:%M:%S) file precision avx2"
  env $AV2 /tmp/llama-avx2-venv/bin/python -m specdec_kernels.bench $A --out $out/file-avx2
fi
echo "=== $(date -u +%H:%M:%S) done"
