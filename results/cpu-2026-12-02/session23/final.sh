# The main job on both paths with the session's shipped assets (no kernel changed: the start's
# cost curves and draft cost stand), alone under the heavy-job lock.
set -u
cd /work/main
out=results/cpu-2026-12-02/session23/final
AVX2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/mainjob-avx512
echo "=== $(date -u +%H:%M:%S) main job avx2"
env $AVX2 python3 -m specdec_kernels.bench --out $out/mainjob-avx2
echo "=== $(date -u +%H:%M:%S) done"
