set -u
cd /tmp/bt3
export PYTHONPATH=/tmp/bt3
out=/work/main/results/cpu-2026-11-27/session17
for isa in avx512 avx2; do
  echo "=== $(date -u +%H:%M:%S) cost curve fp32 $isa"
  python3 -m bench.cost_curve --dtype float32 --models 135m --prefix 512 --tokens 1,2,4,8,16,32 --repeats 9 --isa $isa --out $out/final-cost-fp32-$isa.json 2>&1 | grep "T="
  echo "=== $(date -u +%H:%M:%S) cost curve int4 $isa"
  python3 -m bench.cost_curve --dtype float32 --models 135m --weights int4 --prefix 512 --tokens 1,2,4,8,16,32 --repeats 9 --isa $isa --out $out/final-cost-int4-$isa.json 2>&1 | grep "T="
done
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/main-final > /dev/null 2>&1
echo "=== $(date -u +%H:%M:%S) main job avx2"
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 python3 -m specdec_kernels.bench --out $out/main-final-avx2 > /dev/null 2>&1
echo "=== $(date -u +%H:%M:%S) done"
