# File precision (the GGUF's own weights), llama.cpp beside us: the session's start (worktree
# /tmp/bt22 of 5c07aa7) against the new tree, both paths, alone under the heavy-job lock.
set -u
out=/work/main/results/cpu-2026-11-28/session22
M="hf-generate,ours-autoregressive,ours-suffix,ours-multi,llama-cpp"
A="--weights file --methods $M --prompts-per-category 2 --max-new-tokens 96"
AV2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
echo "=== $(date -u +%H:%M:%S) before avx512"
cd /tmp/bt22 && PYTHONPATH=/tmp/bt22 /tmp/llama-venv/bin/python -m specdec_kernels.bench $A --out $out/file-before-avx512
echo "=== $(date -u +%H:%M:%S) after avx512"
cd /work/main && PYTHONPATH=/work/main /tmp/llama-venv/bin/python -m specdec_kernels.bench $A --out $out/file-after-avx512
echo "=== $(date -u +%H:%M:%S) before avx2"
cd /tmp/bt22 && env $AV2 PYTHONPATH=/tmp/bt22 /tmp/llama-avx2-venv/bin/python -m specdec_kernels.bench $A --out $out/file-before-avx2
echo "=== $(date -u +%H:%M:%S) after avx2"
cd /work/main && env $AV2 PYTHONPATH=/work/main /tmp/llama-avx2-venv/bin/python -m specdec_kernels.bench $A --out $out/file-after-avx2
echo "=== $(date -u +%H:%M:%S) done"
