set -u
cd /tmp/bt18c
export PYTHONPATH=/tmp/bt18c
out=/work/main/results/cpu-2026-11-28/session18
for isa in avx512 avx2; do
  echo "=== $(date -u +%H:%M:%S) cost curve fp32 $isa"
  python3 -m bench.cost_curve --dtype float32 --models 135m --prefix 512 --tokens 1,2,4,6,8,16,32 --repeats 9 --isa $isa --out $out/final-cost-fp32-$isa.json 2>&1 | grep "T="
done
echo "=== $(date -u +%H:%M:%S) cost curve 1.5b fp32 avx2"
python3 -m bench.cost_curve --dtype float32 --models 1.5b --prefix 512 --tokens 1,4,8,16 --repeats 3 --isa avx2 --out $out/cost-1.5b-fp32-avx2.json 2>&1 | grep "T="
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/main-final > /dev/null 2>&1
echo "=== $(date -u +%H:%M:%S) main job avx2"
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python3 -m specdec_kernels.bench --out $out/main-final-avx2 > /dev/null 2>&1
echo "=== $(date -u +%H:%M:%S) done"
