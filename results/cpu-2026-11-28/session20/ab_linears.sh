# A/B of the float32 step linears: before (/tmp/bt20) and now (/work/main), alternating, both ISAs.
for isa in avx512 avx2; do
  envs=""; [ $isa = avx2 ] && envs="SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2"
  for round in 1 2; do
    for tree in /tmp/bt20 /work/main; do
      echo -n "$tree $round "; env $envs PYTHONPATH=$tree python3 /tmp/s20/step_linears_f32.py 1,8,16
    done
  done
done
