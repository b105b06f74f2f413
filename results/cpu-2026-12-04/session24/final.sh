# The closing measurements (after 2cdc23a and its mend 1121e2e), alone: the main job and the
# float32 cost curve on both instruction-set paths of this Zen 4.
set -u
cd /work/main
out=results/cpu-2026-12-04/session24/final
AVX2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/mainjob-avx512
echo "=== $(date -u +%H:%M:%S) main job avx2"
env $AVX2 python3 -m specdec_kernels.bench --out $out/mainjob-avx2
for isa in avx512_bf16 avx2; do
  echo "=== $(date -u +%H:%M:%S) cost curve $isa"
  python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --prefix 512 \
    --tokens 1,2,4,8,12,16,32 --repeats 15 --isa $isa --out $out/cost_fp32_$isa.json
done
echo "=== $(date -u +%H:%M:%S) done"
