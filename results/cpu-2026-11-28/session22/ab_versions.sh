# Alternates the session's start (worktree /tmp/bt22 of 5c07aa7) and the working tree, both ISAs.
cd /work/main/results/cpu-2026-11-28/session22
for isa in avx512_bf16 avx2; do
  for r in 1 2; do
    for root in /tmp/bt22 /work/main; do
      if [ $isa = avx2 ]; then export SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2; fi
      python3 ab_versions.py $root 2>/dev/null | tail -1
    done
  done
done
