# The chosen EAGLE drafter against the shipped one beside our plain loop: the AVX2 path (36 dev
# prompts, greedy) and temperature 0.7 / top-p 0.9 (AVX-512, 12 prompts), one after the other,
# alone under the heavy-job lock.  usage: bash eagle_runs.sh NEW_EAGLE_DIR
set -u
cd /work/main
out=results/cpu-2026-12-02/session23/eagle-runs
NEW=$1
AVX2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
M=ours-autoregressive,ours-eagle
echo "=== $(date -u +%H:%M:%S) avx2 new"
env $AVX2 python3 -m specdec_kernels.bench --methods $M --prompts-per-category 6 --max-new-tokens 128 --eagle-draft $NEW --out $out/avx2-new
echo "=== $(date -u +%H:%M:%S) avx2 shipped-before"
env $AVX2 python3 -m specdec_kernels.bench --methods $M --prompts-per-category 6 --max-new-tokens 128 --eagle-draft /tmp/eagle-before --out $out/avx2-before
echo "=== $(date -u +%H:%M:%S) t0.7 new"
python3 -m specdec_kernels.bench --methods $M --prompts-per-category 2 --max-new-tokens 128 --temperature 0.7 --top-p 0.9 --seed 0 --eagle-draft $NEW --out $out/t07-new
echo "=== $(date -u +%H:%M:%S) t0.7 shipped-before"
python3 -m specdec_kernels.bench --methods $M --prompts-per-category 2 --max-new-tokens 128 --temperature 0.7 --top-p 0.9 --seed 0 --eagle-draft /tmp/eagle-before --out $out/t07-before
echo "=== $(date -u +%H:%M:%S) done"
