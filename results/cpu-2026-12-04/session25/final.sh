# The session's closing measurements, alone: main job, draft cost and cost curve at prefix 512
# on both instruction-set paths (the twenty-third session's measure.sh), then the cost curve at
# prefix 256 and 2048 on both (how c(T) grows with the context).
set -u
cd /work/main
export OUT_DIR=results/cpu-2026-12-04/session25/final
mkdir -p $OUT_DIR
bash results/cpu-2026-12-02/session23/measure.sh
for isa in avx512_bf16 avx2; do
  for prefix in 256 2048; do
    echo "=== $(date -u +%H:%M:%S) cost curve $isa prefix $prefix"
    python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --prefix $prefix \
      --tokens 1,2,4,8,16 --repeats 9 --isa $isa --out $OUT_DIR/cost_fp32_${isa}_p$prefix.json
  done
done
echo "=== $(date -u +%H:%M:%S) done"
