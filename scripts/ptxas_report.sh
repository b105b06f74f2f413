#!/usr/bin/env bash
# Registers, spills and shared memory of the tree-attention and KV-cache kernels as ptxas
# compiles them (no GPU, no torch needed): every instantiation the launchers use, for one
# architecture (default sm_90).
#
#   bash scripts/ptxas_report.sh [ARCH]       # ARCH: 90 (default), 80, ...
#
# The kernels are instantiated from their headers alone (csrc/cuda/kernels/*.cuh and csrc/core/*.h
# have no torch includes), with the half-type flags torch's CUDAExtension passes to nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-90}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/kernels.cu" <<'EOF'
#include "cuda/kernels/kv_cache.cuh"
#include "cuda/kernels/tree_attention.cuh"
namespace specdec {
#define MMA(T, D, M) template __global__ void tree_attention_mma_kernel<T, D, M>(const TreeAttentionParams<T>);
MMA(__half, 64, 1) MMA(__half, 64, 2) MMA(__half, 80, 1) MMA(__half, 80, 2)
MMA(__half, 96, 1) MMA(__half, 96, 2) MMA(__half, 128, 1) MMA(__half, 128, 2)
MMA(__half, 256, 1) MMA(__nv_bfloat16, 128, 2) MMA(__nv_bfloat16, 256, 1)
template __global__ void tree_attention_simt_kernel<float>(const TreeAttentionParams<float>);
template __global__ void tree_attention_simt_kernel<__half>(const TreeAttentionParams<__half>);
template __global__ void tree_attention_combine_kernel<__half>(const TreeAttentionParams<__half>);
template __global__ void compact_kv_columns_kernel<uint4, int64_t, ContiguousRows>(
    CacheTensorTable, ContiguousRows, CompactShape, const int64_t*, const int64_t*, const int64_t*);
template __global__ void compact_kv_columns_kernel<uint4, int64_t, PagedRows<int64_t>>(
    CacheTensorTable, PagedRows<int64_t>, CompactShape, const int64_t*, const int64_t*,
    const int64_t*);
template __global__ void compact_kv_rows_kernel<uint4, int64_t, ContiguousRows>(
    CacheTensorTable, ContiguousRows, CompactShape, const int64_t*, const int64_t*, const int64_t*);
}
EOF
nvcc -std=c++17 --expt-relaxed-constexpr -O3 -Icsrc -D__CUDA_NO_HALF_OPERATORS__ \
  -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
  -gencode="arch=compute_${arch},code=sm_${arch}" -Xptxas -v -c "$work/kernels.cu" \
  -o "$work/kernels.o" 2>"$work/ptxas.log" || { cat "$work/ptxas.log"; exit 1; }
python3 - "$work/ptxas.log" "$arch" <<'EOF'
import re, subprocess, sys
lines = open(sys.argv[1]).read().splitlines()
rows, name = [], None
for line in lines:
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        name = subprocess.run(["c++filt"], input=m.group(1), capture_output=True, text=True).stdout.strip()
        name = name.replace("specdec::", "").replace("(TreeAttentionParams<__half> const)", "")
        name = re.sub(r"\(.*\)$", "", name)
        entry = {"kernel": name}
        rows.append(entry)
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and rows:
        rows[-1].update(stack=m.group(1), spill_st=m.group(2), spill_ld=m.group(3))
    m = re.search(r"Used (\d+) registers", line)
    if m and rows:
        rows[-1]["regs"] = m.group(1)
print(f"| kernel (sm_{sys.argv[2]}) | registers | stack | spill stores | spill loads |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    print(f"| `{r['kernel']}` | {r.get('regs', '?')} | {r.get('stack', '?')} | {r.get('spill_st', '?')} | {r.get('spill_ld', '?')} |")
EOF
