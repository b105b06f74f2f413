set -u
cd /tmp/bt
export PYTHONPATH=/tmp/bt
out=results/cpu-2026-11-27/session16
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/main-final
echo "=== $(date -u +%H:%M:%S) main job avx2"
SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 python3 -m specdec_kernels.bench --out $out/main-final-avx2
echo "=== $(date -u +%H:%M:%S) done"
