#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU (no network needed), build the CUDA extension, run the
# whole test suite (CUDA vs CPU vs reference), run compute-sanitizer over the kernel tests and
# run the microbenchmarks and measure the step-cost curves of the GPU projection; write a
# Markdown report for bench/RESULTS.md.
#
#   bash scripts/gpu_check.sh [STAGE ...]     stages: build test sanitize bench curve (default: all)
#
# Output goes to $OUT (the device tool's folder) or build/gpu_check: gpu_check.md (the report),
# plus logs and the benchmark JSON. Each stage appends its section, so stages may run in
# separate calls on the same machine. Environment: MAX_JOBS (default: all cores),
# TORCH_CUDA_ARCH_LIST (default: the GPU's own arch, to keep the build short).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-build/gpu_check}
mkdir -p "$OUT_DIR"
REPORT="$OUT_DIR/gpu_check.md"
STAGES=${*:-build test sanitize bench curve}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
status=0

section() { printf '\n### %s\n\n' "$1" >>"$REPORT"; }
fenced() { { echo '```'; cat; echo '```'; } >>"$REPORT"; }

if [ ! -f "$REPORT" ]; then
  {
    echo "## GPU check $(date -u +%Y-%m-%d)"
    echo
    echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    echo "- torch: $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
    echo "- nvcc: $(nvcc --version | tail -1)"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- command: \`bash scripts/gpu_check.sh $STAGES\`"
  } >"$REPORT"
fi

for stage in $STAGES; do
  case "$stage" in
  build)
    section "build"
    arch=$($PY -c 'import torch; c = torch.cuda.get_device_capability(); print(f"{c[0]}.{c[1]}")')
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch}
    start=$(date +%s)
    if SPECDEC_BUILD_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} $PY -m pip install -q --no-build-isolation \
      --no-deps --no-index -e . >"$OUT_DIR/build.log" 2>&1; then
      $PY -c 'import specdec_kernels as s; print(s.build_info())' 2>&1 | fenced
      echo "built in $(($(date +%s) - start)) s for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST" >>"$REPORT"
    else
      status=1; echo "BUILD FAILED" >>"$REPORT"; tail -40 "$OUT_DIR/build.log" | fenced
    fi
    ;;
  test)
    section "tests (whole suite, CPU and CUDA)"
    $PY -m pytest -q -p no:cacheprovider python_tests >"$OUT_DIR/tests.log" 2>&1 || status=1
    grep -E "passed|failed|error" "$OUT_DIR/tests.log" | tail -15 | fenced
    ;;
  sanitize)
    section "compute-sanitizer memcheck over the CUDA kernel tests"
    # CUDA-parametrized kernel tests only; torch.compile cases and the 10^6-request statistical
    # tests (test_lossless.py) are left out (slow under the tool).
    compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
      $PY -m pytest -q -p no:cacheprovider -x -k "cuda and not compile and not lossless" \
      $(ls python_tests/test_*.py | grep -v -E "decoding|models|hf_") \
      >"$OUT_DIR/sanitizer.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|passed|failed|error" "$OUT_DIR/sanitizer.log" | tail -10 | fenced
    ;;
  bench)
    section "microbenchmarks (median over rounds; GB/s counts bytes read + written)"
    $PY -m bench --out "$OUT_DIR" -k "cuda" --benchmark-max-time=0.5 \
      >"$OUT_DIR/bench.log" 2>&1 || status=1
    if [ -f "$OUT_DIR/microbench.md" ]; then
      cat "$OUT_DIR/microbench.md" >>"$REPORT"
    else
      tail -30 "$OUT_DIR/bench.log" | fenced
    fi
    ;;
  curve)
    section "step cost vs tokens verified per step (random weights, bf16; the GPU projection's input)"
    $PY -m bench.cost_curve --device cuda --dtype bfloat16 --models 135m,1.5b,7b \
      --out "$OUT_DIR/curve-gpu.json" >"$OUT_DIR/curve.log" 2>&1 || status=1
    tail -40 "$OUT_DIR/curve.log" | fenced
    ;;
  *) echo "unknown stage: $stage (build test sanitize bench curve)"; exit 2 ;;
  esac
done
echo "report: $REPORT (status $status)"
tail -60 "$REPORT"
exit $status
