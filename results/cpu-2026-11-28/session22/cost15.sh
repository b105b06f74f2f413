# The 1.5b shape's float32 cost curve on this session's code, both paths (issue 21's second table).
set -u
cd /work/main
out=results/cpu-2026-11-28/session22
echo "=== $(date -u +%H:%M:%S) 1.5b avx512"
python3 -m bench.cost_curve --device cpu --dtype float32 --models 1.5b --prefix 512 --tokens 1,8,16 --repeats 3 --isa avx512_bf16 --out $out/cost15_fp32_avx512_bf16.json
echo "=== $(date -u +%H:%M:%S) 1.5b avx2"
python3 -m bench.cost_curve --device cpu --dtype float32 --models 1.5b --prefix 512 --tokens 1,8,16 --repeats 3 --isa avx2 --out $out/cost15_fp32_avx2.json
echo "=== $(date -u +%H:%M:%S) done"
