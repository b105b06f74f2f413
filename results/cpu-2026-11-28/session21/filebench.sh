set -u
out=/work/main/results/cpu-2026-11-28/session21
M="hf-generate,ours-autoregressive,ours-medusa,ours-eagle,ours-multi,ours-suffix,llama-cpp"
A="--weights file --methods $M --prompts-per-category 2 --max-new-tokens 96"
AV2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
echo "=== $(date -u +%H:%M:%S) before (30263d5) avx512"
cd /tmp/bt21 && PYTHONPATH=/tmp/bt21 /tmp/llama-venv/bin/python -m specdec_kernels.bench $A --out $out/file-before-avx512
echo "=== $(date -u +%H:%M:%S) after avx512"
cd /work/main && PYTHONPATH=/work/main /tmp/llama-venv/bin/python -m specdec_kernels.bench $A --out $out/file-after-avx512
echo "=== $(date -u +%H:%M:%S) before (30263d5) avx2"
cd /tmp/bt21 && env $AV2 PYTHONPATH=/tmp/bt21 /tmp/llama-avx2-venv/bin/python -m specdec_kernels.bench $A --out $out/file-before-avx2
echo "=== $(date -u +%H:%M:%S) after avx2"
cd /work/main && env $AV2 PYTHONPATH=/work/main /tmp/llama-avx2-venv/bin/python -m specdec_kernels.bench $A --out $out/file-after-avx2
echo "=== $(date -u +%H:%M:%S) done"
