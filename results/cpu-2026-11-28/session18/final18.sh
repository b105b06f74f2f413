set -u
cd /tmp/bt18b
export PYTHONPATH=/tmp/bt18b
out=/work/main/results/cpu-2026-11-28/session18
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/main-final > /dev/null 2>&1
echo "=== $(date -u +%H:%M:%S) main job avx2"
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python3 -m specdec_kernels.bench --out $out/main-final-avx2 > /dev/null 2>&1
echo "=== $(date -u +%H:%M:%S) done"
