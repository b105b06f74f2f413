set -u
cd /work/main
out=results/cpu-2026-11-28/session21
echo "=== $(date -u +%H:%M:%S) cost curve avx512"
python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --prefix 512 --tokens 1,2,4,8,12,16,32 --repeats 9 --isa avx512_bf16 --out $out/cost_fp32_avx512_bf16.json
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/final-mainjob-avx512
echo "=== $(date -u +%H:%M:%S) done"
