set -u
for round in 1 2 3; do
  for side in /work/main /tmp/bt; do
    for isa in avx512_bf16 avx2; do
      echo "--- round $round $side $isa"
      (cd $side && PYTHONPATH=$side python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 135m --tokens 1,4,8 --repeats 10 --isa $isa 2>&1 | grep "T=")
    done
  done
done
