cd /work/main
T='GLIBC_TUNABLES=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824'
for r in 1 2; do
  python3 -m specdec_kernels.bench --methods hf-generate,ours-autoregressive,ours-quantized-self,ours-suffix --out /tmp/s22/mab/default$r > /tmp/s22/mab/default$r.log 2>&1
  env GLIBC_TUNABLES=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824 python3 -m specdec_kernels.bench --methods hf-generate,ours-autoregressive,ours-quantized-self,ours-suffix --out /tmp/s22/mab/tuned$r > /tmp/s22/mab/tuned$r.log 2>&1
done
