# The session's closing measurements, alone under the heavy-job lock: main job, draft cost
# and cost curve, on both instruction-set paths.
set -u
cd /work/main
out=${OUT_DIR:?}
AVX2="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
echo "=== $(date -u +%H:%M:%S) main job avx512"
python3 -m specdec_kernels.bench --out $out/mainjob-avx512
echo "=== $(date -u +%H:%M:%S) main job avx2"
env $AVX2 python3 -m specdec_kernels.bench --out $out/mainjob-avx2
echo "=== $(date -u +%H:%M:%S) draft cost avx512"
python3 -m bench.quantized_cost --prefix 256 --repeats 30 --out $out/qcost_avx512.json
echo "=== $(date -u +%H:%M:%S) draft cost avx2"
env $AVX2 python3 -m bench.quantized_cost --prefix 256 --repeats 30 --out $out/qcost_avx2.json
echo "=== $(date -u +%H:%M:%S) cost curve avx512"
python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --prefix 512 --tokens 1,2,4,8,12,16,32 --repeats 9 --isa avx512_bf16 --out $out/cost_fp32_avx512_bf16.json
echo "=== $(date -u +%H:%M:%S) cost curve avx2"
python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --prefix 512 --tokens 1,2,4,8,12,16,32 --repeats 9 --isa avx2 --out $out/cost_fp32_avx2.json
echo "=== $(date -u +%H:%M:%S) done"
