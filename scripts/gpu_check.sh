#!/usr/bin/env bash
# GPU check: turn one lent GPU session into the whole truth, in stages that each fit one device
# call: build; kernel tests (CUDA vs CPU vs reference); end to end (decoding on CUDA with tiny
# random models, the step-cost curve, bench.projection); microbenchmarks (with the measured
# copy and matmul ceilings); compute-sanitizer. Each stage appends its section to one report.
#
#   bash scripts/gpu_check.sh [reset] STAGE [STAGE ...]   stages: build kernels e2e bench sanitize
#   bash scripts/gpu_check.sh fingerprint                 hash of the sources (compare with the report)
#   bash scripts/gpu_check.sh acceptance                  the results.json `e2e` projects from
#
# The device calls, one stage each, back to back on the same warm machine: the machine goes
# back (and a later call gets a fresh, bare one) once it has been idle 30 s, so start each call
# as soon as the last reply is in. A call runs on a copy of the session's own checkout (the
# lead's, not a helper's worktree), so this script and the sources must be there. Nothing is
# carried: `build` compiles on the machine, in place (specdec_kernels/_C*.so, plus the marker
# build/gpu_check.built), and these ignored build outputs stay there between calls while it is
# warm.
#   1. run(command="bash scripts/gpu_check.sh reset build", timeout_s=600)
#   2. run(command="bash scripts/gpu_check.sh kernels", timeout_s=600)
#   3. run(command="bash scripts/gpu_check.sh e2e", timeout_s=600)
#   4. run(command="bash scripts/gpu_check.sh bench", timeout_s=600)
#   5. run(command="GPU_CHECK_SECONDS=<s> bash scripts/gpu_check.sh sanitize", timeout_s=600)
#      (read `status` first: <s> = budget_left_s - 120, at most 550; sanitize runs last because
#      it is time-boxed and uses whatever it is given: default 240)
# If the machine was lost between calls (idle, or given back), the next stage finds no build,
# says so at the top of its section ("NO BUILD ON THIS MACHINE") and exits with status 4
# without running anything: call `bash scripts/gpu_check.sh build` again, then go on with the
# stage that was refused. The same happens (status 4, "BUILD IS STALE") when csrc/ or setup.py
# changed since the build. If `build` itself stops at its budget, call it again: ninja keeps
# the objects already compiled.
#
# Budgets (seconds, from the call's start, the stage's own budget; at most 550 so a 600 s call
# always ends with its report): build 400, kernels 300, e2e 300, bench 210, sanitize 240:
# 1450 s (24 minutes) together, about 27 of the session's 30 with the machine's start and the
# replies. Measured on an H200 (2026-11-26): build 116-125 s with 16 jobs for one arch; kernels
# 90 s with 8 xdist workers. A session now has 15 minutes of device time, start included.
# Measured on the H200 (2026-11-27): build 153 s, kernels 54 s, e2e 131 s, bench 44 s, sanitize
# 92 s at a 165 s budget; 684 s held in all, the start included. So two calls:
#   1. GPU_CHECK_SECONDS=260 bash scripts/gpu_check.sh reset build kernels   (240 s)
#   2. GPU_CHECK_SECONDS=250 bash scripts/gpu_check.sh e2e bench sanitize   (about 330 s)
# `e2e` keeps 120 s of its budget for the curve and the projections, and its tests need about
# 100 s (55 s of tests after collection): below GPU_CHECK_SECONDS=230 it stops before its tests.
# The tree that travels must stay under the device's 64 MiB: past sessions' raw results push the
# tracked files over it (93 MB on 2026-12-04), so first `bash scripts/device_tree.sh slim` here
# (it prints the GPU_CHECK_ACCEPTANCE=... to put before `e2e`), and `restore` after the calls.
# Each call returns 2 files under $OUT (the device allows 8): gpu_check.md, the report so far
# (every stage run on this machine), and gpu_check_logs.tar.gz (logs, JUnit XML, benchmark,
# ceilings and curve JSON, resource usage). The reply's output_tail ends with the stage's own
# section. Copy what is worth keeping into bench/results/ and bench/RESULTS.md (date, device,
# command).
#
# Time: each call stops itself within its budget: pytest runs under --stop-after (no new test
# starts, the summary is still written), every command under `timeout`, and every test under a
# per-test timeout (--per-test-timeout of python_tests/pytest_deadline.py: pytest-timeout's
# signal method where it is installed, as on the GPU machine; a SIGALRM timer where it is not).
#
# Without a GPU (or with GPU_CHECK_DRY=1) every stage runs as a short dry run on CPU: the same
# commands and report with the device set to cpu and small test selections; it checks this
# script's logic, not the kernels. Only what needs a GPU (compute-sanitizer, cuobjdump of CUDA
# code) is skipped. A dry run of all stages takes a few minutes once the CPU build is current.
#
# Exit status: 0 all passed; 1 a failure (build, test, sanitizer finding, command); 2 usage;
# 3 a stage stopped at its budget before its tests were done (GPU runs only; not sanitize,
# which is time-boxed by design); 4 no build or a
# stale one (run `build`).
#
# Environment: OUT (the device tool's folder; default build/gpu_check/out), GPU_CHECK_SECONDS
# (the stage's budget), GPU_CHECK_ACCEPTANCE (the results.json the projections read; default: the
# most recently committed), GPU_CHECK_DRY (0/1; default 1 when no GPU is visible), GPU_CHECK_STATE
# (the state folder, default build/gpu_check), TORCH_CUDA_ARCH_LIST (default: the visible GPU's,
# e.g. 9.0 on an H100: one arch keeps the build short), MAX_JOBS (default: all cores),
# PYTEST_TIMEOUT (per-test seconds, default 150; PYTEST_TIMEOUT_SANITIZER 400).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# No network on the GPU machine: never wait on the Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}
STATE=${GPU_CHECK_STATE:-build/gpu_check}   # ignored build output: kept while the machine is warm
BUILT=$STATE.built                          # written by a successful build; kept by `reset`
OUT_DIR=${OUT:-$STATE/out}
REPORT=$STATE/gpu_check.md
MAX_OUT_FILES=8
# Kernel tests: the ops against the reference and the CPU kernels (whichever of these exist).
KERNEL_TESTS=$(for n in verify sampling sampling_paths tree_attention kv_cache tree lossless \
  small_batch_linear quantized_linear 'compat_*'; do ls python_tests/test_$n.py 2>/dev/null; done | tr '\n' ' ')
# CPU-side tests with nothing to run on a GPU (the CUDA kernels' CPU emulator and its mutation
# check, install.sh with a stand-in Python): CI's alone.
CPU_ONLY_TESTS=$(ls python_tests/test_cuda_emulat*.py python_tests/test_mutation_check.py \
  python_tests/test_install_script.py 2>/dev/null | tr '\n' ' ')
# End to end: every other test file (decoding, HF integration, models, harness, projection,
# this script's tools).
E2E_TESTS=$(ls python_tests/test_*.py | grep -v -F -x -f <(tr ' ' '\n' <<<"$KERNEL_TESTS $CPU_ONLY_TESTS" | grep .) \
  | tr '\n' ' ')

# fingerprint [PATH ...]: a short hash of the sources under PATHs (default: everything that
# matters to the check).
fingerprint() {
  local paths=("$@")
  [ ${#paths[@]} -gt 0 ] || paths=(csrc specdec_kernels bench python_tests scripts setup.py pyproject.toml)
  find "${paths[@]}" -type f \
    \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' -o -name '*.sh' \
    -o -name '*.toml' \) ! -name _build_config.py ! -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12
}

# methods_in RESULTS_JSON: how many methods a benchmark run measured (0 if unreadable).
methods_in() {
  $PY -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["figures"]))' "$1" 2>/dev/null || echo 0
}

# newest_acceptance: the results.json the projections read by default. Raw runs sit in
# bench/results/ and results/, nested by session; of the runs committed in the newest one's
# last day, the one with the most methods (a session commits its main job beside subsets).
newest_acceptance() {
  find bench/results results -name results.json 2>/dev/null \
    | while read -r f; do echo "$(git log -1 --format=%ct -- "$f" 2>/dev/null || echo 0) $(methods_in "$f") $f"; done \
    | sort -n -k1,1 | awk '{ t[NR] = $1; n[NR] = $2; f[NR] = $3 }
        END { for (i = 1; i <= NR; i++) if (t[i] >= t[NR] - 86400 && n[i] >= best) { best = n[i]; pick = f[i] }
              print pick }'
}

stages=()
do_reset=0
for arg in "$@"; do
  case "$arg" in
    reset) do_reset=1 ;;
    fingerprint) fingerprint; exit 0 ;;
    acceptance) newest_acceptance; exit 0 ;;
    build|kernels|e2e|bench|sanitize) stages+=("$arg") ;;
    *) echo "unknown stage: $arg (stages: reset build kernels e2e bench sanitize; or fingerprint, acceptance)"; exit 2 ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || { echo "usage: bash scripts/gpu_check.sh [reset] build|kernels|e2e|bench|sanitize ..."; exit 2; }

if [ -z "${GPU_CHECK_DRY:-}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
    && $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    GPU_CHECK_DRY=0
  else
    GPU_CHECK_DRY=1
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
      GPU_WARNING="**nvidia-smi sees a GPU but torch does not (torch.cuda.is_available() is false): this is a DRY RUN on CPU**"
      echo "gpu_check: $GPU_WARNING" >&2
    fi
  fi
fi
if [ "$GPU_CHECK_DRY" = 1 ]; then DEV=cpu; else DEV=cuda; fi
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-150}
if $PY -c 'import pytest_timeout' 2>/dev/null; then TIMEOUT_HOW=pytest-timeout; else TIMEOUT_HOW="SIGALRM fallback, no pytest-timeout"; fi

if [ $do_reset = 1 ]; then rm -rf "$STATE" "$OUT_DIR/gpu_check.md" "$OUT_DIR/gpu_check_logs.tar.gz"; fi
mkdir -p "$STATE" "$OUT_DIR"
status=0

now() { date +%s; }
# Seconds left of this call's budget, less a reserve (default 20 s) for writing the report.
left() { echo $((CALL_START + BUDGET - $(now) - ${1:-20})); }
note() { printf '%s\n' "$*" >>"$REPORT"; }
fenced() { { echo '```'; cat; echo '```'; } >>"$REPORT"; }
fail() { [ "$status" -gt 0 ] && [ "$status" -ne 3 ] || status=$1; }  # keep the first hard status

# The report and one tarball of everything else under $OUT, refreshed after every step so that
# even a call killed from outside leaves the latest state there. The device returns at most 8
# files of at most 16 MiB: logs over 4 MiB go in as their first and last 2000 lines.
publish() {
  local cut big f
  cp "$REPORT" "$OUT_DIR/gpu_check.md" 2>/dev/null
  cut=$(realpath -m "$STATE/.cut")
  rm -rf "$cut"; mkdir -p "$cut"
  big=$(find "$STATE" -maxdepth 2 -type f -size +4M ! -path "$STATE/out/*" ! -path "$STATE/.cut/*")
  for f in $big; do
    { head -2000 "$f"; echo "... [$(wc -l <"$f") lines, cut to fit the device's file limit] ..."; tail -2000 "$f"; } \
      >"$cut/$(basename "$f").cut"
  done
  # shellcheck disable=SC2046
  tar czf "$OUT_DIR/gpu_check_logs.tar.gz.tmp" --exclude=./out --exclude=./.cut \
    $(for f in $big; do printf -- '--exclude=./%s ' "${f#"$STATE"/}"; done) -C "$STATE" . -C "$cut" . 2>/dev/null \
    && mv "$OUT_DIR/gpu_check_logs.tar.gz.tmp" "$OUT_DIR/gpu_check_logs.tar.gz"
  rm -rf "$cut"
}
# limited SECONDS LOG CMD...: run CMD with its output in LOG; SIGINT at the limit (pytest then
# writes its summary), SIGKILL 20 s later. Returns CMD's status (124/137 when stopped).
limited() {
  local secs=$1 log=$2; shift 2
  if [ "$secs" -lt 10 ]; then echo "no time left for: $*" >"$log"; return 124; fi
  echo "\$ $(printf '%q ' "$@")" >"$log"
  timeout -s INT -k 20 "$secs" "$@" >>"$log" 2>&1
}
# pytest_args NAME SECONDS PER_TEST: the options every pytest run here takes.
pytest_args() {
  local name=$1 secs=$2 per_test=$3
  echo "-v -p no:cacheprovider -p python_tests.pytest_deadline --stop-after $((secs - 30 > 10 ? secs - 30 : 10))"
  echo "--per-test-timeout $per_test --junitxml=$STATE/$name.xml -o junit_logging=no"
}
# workers: pytest-xdist's options on the GPU machine (it has xdist and 16 cores): the test
# stages run in 8 processes sharing the GPU, and a test that crashes its process (as every
# C++-raised error did on the first GPU machine) fails alone instead of ending the stage. None on
# a dry run or without xdist.
workers() {
  if [ "$GPU_CHECK_DRY" = 0 ] && $PY -c 'import xdist' 2>/dev/null; then
    echo "-n ${GPU_CHECK_WORKERS:-8} --max-worker-restart 400"
  fi
}
# Exit statuses of pytest: 0 all passed, 1 failures, 2 stopped (budget), 5 nothing selected.
judge() {
  local rc=$1 what=$2
  case $rc in
    0) note "result: passed" ;;
    2|124|137) note "result: **stopped at its time budget** (rc $rc): the run is incomplete"
       [ "$GPU_CHECK_DRY" = 1 ] || fail 3 ;;
    5) note "result: **no test selected** (rc 5)"; fail 1 ;;
    *) note "result: **FAILED** (rc $rc): $what"; fail 1 ;;
  esac
}

# cuda_tool NAME: the path of a CUDA toolkit program (PATH, then CUDA_HOME, then the usual
# place), or nothing.
cuda_tool() {
  command -v "$1" 2>/dev/null \
    || ls "${CUDA_HOME:-/usr/local/cuda}/bin/$1" /usr/local/cuda/bin/"$1" 2>/dev/null | head -1
}

# What a build made here must match: the compiled sources, CUDA or not, Python and torch.
build_id() {
  echo "sources $(fingerprint csrc setup.py), cuda $([ "$GPU_CHECK_DRY" = 1 ] && echo 0 || echo 1)," \
    "$($PY -c 'import sys, torch; print("python", sys.version.split()[0] + ", torch", torch.__version__)' 2>&1 | tail -1)"
}

# Later stages run only on this machine's own, current build: a fresh machine (the last one
# went back while idle) has none, and a build of other sources would test the wrong kernels.
ensure_built() {
  local want=has_cuda_kernels problem="" id
  [ "$GPU_CHECK_DRY" = 1 ] && want=build_info
  id=$(build_id)
  if [ ! -f "$BUILT" ]; then
    problem="NO BUILD ON THIS MACHINE ($BUILT is missing): a fresh machine, the last one"
    problem+=" having gone back while idle (30 s), or \`build\` never ran or failed here"
  elif [ "$(cat "$BUILT")" != "$id" ]; then
    problem="BUILD IS STALE: built from $(cat "$BUILT"); here: $id"
  elif ! $PY -c "import specdec_kernels as s, sys; sys.exit(0 if s.$want() else 1)" >"$STATE/import.log" 2>&1; then
    problem="THE BUILD DOES NOT LOAD (specdec_kernels.$want() failed or is false): $(tail -1 "$STATE/import.log")"
  fi
  [ -z "$problem" ] && return 0
  note "**$problem.** Nothing was run. Call \`bash scripts/gpu_check.sh build\` (its own device call), then this stage again."
  echo "gpu_check: $problem; run \`bash scripts/gpu_check.sh build\` first" >&2
  fail 4
  return 1
}

build() {
  local arch cuda=1 start rc so want
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    cuda=0; arch=${TORCH_CUDA_ARCH_LIST:-}
  else
    arch=${TORCH_CUDA_ARCH_LIST:-$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
  fi
  rm -f "$BUILT"
  # The image's CXX (/opt/gcc/bin/g++) has only a static libstdc++, which setup.py refuses (a
  # second copy inside _C.so crashed every C++ error on the first GPU run): use the system's.
  if ! "${CXX:-c++}" -print-file-name=libstdc++.so 2>/dev/null | grep -q '^/' && [ -x /usr/bin/g++ ]; then
    note "CXX=${CXX:-c++} has no shared libstdc++: building with CC=/usr/bin/gcc CXX=/usr/bin/g++"
    export CC=/usr/bin/gcc CXX=/usr/bin/g++
  fi
  start=$(now)
  # In place (never pip -e), with the torch installed here; nothing is downloaded. ninja
  # rebuilds only what changed, so a build stopped at its budget goes on where it stopped.
  SPECDEC_BUILD_CUDA=$cuda TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    limited "$(left 40)" "$STATE/build.log" $PY setup.py build_ext --inplace
  rc=$?
  if [ $rc -ne 0 ]; then
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      note "**build stopped at its budget** after $(($(now) - start)) s: call \`build\` again (ninja keeps what was compiled)"
    else
      note "**build FAILED** (rc $rc) after $(($(now) - start)) s; its errors and the end of build.log:"
      grep -E "error|Error" "$STATE/build.log" | head -20 | fenced
      tail -25 "$STATE/build.log" | fenced
    fi
    fail 1; return 1
  fi
  note "built in $(($(now) - start)) s (\`python3 setup.py build_ext --inplace\` with" \
    "SPECDEC_BUILD_CUDA=$cuda TORCH_CUDA_ARCH_LIST=${arch:-none} MAX_JOBS=${MAX_JOBS:-$(nproc)}):"
  $PY -c 'import specdec_kernels as s; print(s.build_info())' 2>&1 | tail -5 | fenced
  if [ "$GPU_CHECK_DRY" = 1 ]; then want=build_info; else want=has_cuda_kernels; fi
  if ! $PY -c "import specdec_kernels as s, sys; sys.exit(0 if s.$want() else 1)" >/dev/null 2>&1; then
    note "**the build does not load, or has no CUDA kernels** (specdec_kernels.$want())"
    fail 1; return 1
  fi
  build_id >"$BUILT"
  note "build id (later stages check it): $(cat "$BUILT")"
  # A C++-raised error must reach Python as ValueError; on the first GPU machine every one from
  # the CUDA build crashed the process instead (see gpu_check_report.py errors).
  note ""
  note "C++ error path and toolchain (\`python3 scripts/gpu_check_report.py errors --device $DEV\`):"
  note ""
  $PY scripts/gpu_check_report.py errors --device "$DEV" >>"$REPORT" 2>&1
  # Build warnings, for the kernels' authors (nvcc's own are errors in CI's compile check).
  if grep -q -E ': warning|warning #' "$STATE/build.log"; then
    note "compiler warnings: $(grep -c -E ': warning|warning #' "$STATE/build.log") (in build.log)"
  fi
  so=$(ls specdec_kernels/_C*.so 2>/dev/null | head -1)
  if [ "$GPU_CHECK_DRY" = 0 ] && [ -n "$(cuda_tool cuobjdump)" ] && [ -n "$so" ]; then
    "$(cuda_tool cuobjdump)" -res-usage "$so" >"$STATE/resource_usage.txt" 2>&1
    note ""
    note "Registers and memory per kernel (cuobjdump -res-usage; local B > 0 means spills):"
    note ""
    $PY scripts/gpu_check_report.py resources "$STATE/resource_usage.txt" >>"$REPORT"
  else
    note "per-kernel resource usage: skipped (needs cuobjdump and a CUDA build)"
  fi
}

stage_build() {
  build
}

# run_tests NAME SECONDS PER_TEST PYTEST_ARGS...: pytest within SECONDS; its summary goes into
# the report.
run_tests() {
  local name=$1 secs=$2 per_test=$3; shift 3
  local rc
  # shellcheck disable=SC2046
  limited "$secs" "$STATE/$name.log" $PY -m pytest $(pytest_args "$name" "$secs" "$per_test") \
    $(workers) "$@"
  rc=$?
  note "\`pytest $(printf '%q ' "$@" | cut -c1-300)\` ($(grep -m1 -o 'collected [0-9]* items.*' "$STATE/$name.log" || echo 'nothing collected')):"
  note ""
  $PY scripts/gpu_check_report.py junit "$STATE/$name.xml" "$STATE/$name.log" >>"$REPORT"
  judge $rc "see $name.log"
  publish
  return $rc
}

stage_kernels() {
  ensure_built || return
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    # A short CPU selection: proves the command and the report, not the kernels.
    run_tests kernels "$(left)" "$PYTEST_TIMEOUT" \
      -k "matches_reference and not compile and not test_tree_attention" $KERNEL_TESTS
  else
    # Every CUDA case (against the reference and the CPU kernels) and every device-free test;
    # the CPU cases are CI's and would only halve the budget.
    run_tests kernels "$(left)" "$PYTEST_TIMEOUT" -k "not cpu" $KERNEL_TESTS
  fi
}

stage_e2e() {
  ensure_built || return
  local curve=$STATE/curve-$DEV.json acceptance model rc table
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    # The engine on a tiny random Llama model through the tree-attention kernel, on CPU; the
    # default model's tests are deselected (on the GPU machine they skip: no model, no gguf).
    # The curve and the projection get the last 60 s.
    run_tests e2e "$(left 60)" "$PYTEST_TIMEOUT" -m "not default_model" \
      -k "test_float32_greedy_matches_hf_generate and llama and tree" $E2E_TESTS
  else
    # As for the kernels: the CUDA cases and the device-free tests, less the tests that run
    # this script (its dry run, which CI covers). The curve and the projections get the
    # last 120 s.
    run_tests e2e "$(left 120)" "$PYTEST_TIMEOUT" -k "not cpu and not test_script_" $E2E_TESTS
  fi
  note ""
  note "Step cost against tokens verified per step (random weights; the projection's input):"
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    # Two widths only, but up to 128: lookahead's acceptance table needs the whole range.
    limited "$(left)" "$STATE/curve.log" $PY -m bench.cost_curve --device cpu --dtype float32 \
      --models 135m --prefix 8 --tokens 1,128 --repeats 1 --out "$curve"
  else
    limited "$(left 50)" "$STATE/curve.log" $PY -m bench.cost_curve --device cuda --dtype bfloat16 \
      --models 135m,1.5b,7b --out "$curve"
  fi
  rc=$?
  tail -n "$([ $rc -eq 0 ] && echo 40 || echo 6)" "$STATE/curve.log" | fenced
  judge $rc "see curve.log"
  publish
  [ -f "$curve" ] || return
  # Acceptance from the most recently committed benchmark run (any machine: it is the models'
  # property; raw runs sit in bench/results/ and results/, nested by session): of the runs
  # committed in the newest one's last day, the one with the most methods (a session commits
  # its main job beside subsets of it).
  # GPU_CHECK_ACCEPTANCE names another.
  acceptance=${GPU_CHECK_ACCEPTANCE:-$(newest_acceptance)}
  [ -n "$acceptance" ] || { note "no committed results.json to project from"; return; }
  for model in $($PY -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["models"]))' "$curve"); do
    note ""
    limited "$(left)" "$STATE/projection-$model.log" $PY -m bench.projection --curve "$curve" \
      --model "$model" --results "$acceptance" --out "$STATE/projection-$model.md"
    rc=$?
    note "\`python3 -m bench.projection --curve curve-$DEV.json --model $model --results $acceptance\`:"
    note ""
    if [ $rc -eq 0 ]; then
      cat "$STATE/projection-$model.md" >>"$REPORT"
    else
      tail -20 "$STATE/projection-$model.log" | fenced; judge $rc "see projection-$model.log"
    fi
  done
  # Lookahead's (W, N, G) for this device: the committed acceptance table on this curve.
  table=$(ls bench/results/*/lookahead-acceptance.json 2>/dev/null | tail -1)
  if [ -f bench/lookahead_defaults.py ] && [ -n "$table" ]; then
    note ""
    note "Lookahead defaults on this curve (\`python3 -m bench.lookahead_defaults select --curve curve-$DEV.json --table $table\`):"
    limited "$(left)" "$STATE/lookahead-defaults.log" $PY -m bench.lookahead_defaults select \
      --curve "$curve" --table "$table"
    rc=$?
    tail -n +2 "$STATE/lookahead-defaults.log" | tail -30 | fenced
    judge $rc "see lookahead-defaults.log"
  fi
}

stage_bench() {
  ensure_built || return
  local rc sel="$DEV" extra=() secs
  note "Ceilings measured here (the roofline's denominators):"
  note ""
  limited 120 "$STATE/ceilings.log" $PY scripts/gpu_check_report.py ceilings --device "$DEV" \
    --out "$STATE/ceilings.json"
  rc=$?
  if [ $rc -eq 0 ]; then
    grep '^- ' "$STATE/ceilings.log" >>"$REPORT"
  else
    tail -5 "$STATE/ceilings.log" | fenced; judge $rc "see ceilings.log"
  fi
  note ""
  secs=$(left)
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    # A taste on CPU: three small cases of one op, few rounds.
    sel="cpu and op and test_sample and 32000"; extra=(--benchmark-max-time=0.05 --benchmark-min-rounds=2)
  fi
  # shellcheck disable=SC2046
  limited "$secs" "$STATE/bench.log" $PY -m bench --out "$STATE/bench" -k "$sel" "${extra[@]}" \
    $(pytest_args bench "$secs" "$PYTEST_TIMEOUT")
  rc=$?
  note "\`python3 -m bench -k \"$sel\"\` (median over rounds; GB/s counts bytes read + written):"
  note ""
  if [ -s "$STATE/bench/microbench.md" ]; then
    cat "$STATE/bench/microbench.md" >>"$REPORT"
  else
    tail -30 "$STATE/bench.log" | fenced
  fi
  judge $rc "see bench.log"
}

# sanitize_with TOOL SECONDS SELECTION: one compute-sanitizer tool over the kernel tests that
# SELECTION picks, within SECONDS.
sanitize_with() {
  local tool=$1 secs=$2 sel=$3 rc
  note ""
  note "**$tool** over \`-k \"$sel\"\` (${secs} s budget):"
  note ""
  if [ "$GPU_CHECK_DRY" = 0 ] && [ -z "$(cuda_tool compute-sanitizer)" ]; then
    note "result: **compute-sanitizer not found** (PATH, CUDA_HOME/bin, /usr/local/cuda/bin)"
    fail 1; return
  fi
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    # The same command on CPU without the tool: proves the selection and the report.
    run_tests "sanitize-$tool" "$secs" "${PYTEST_TIMEOUT_SANITIZER:-400}" -k "$sel" $KERNEL_TESTS
    note "(dry run: compute-sanitizer skipped, it needs a GPU)"
    return
  fi
  # Every tensor its own cudaMalloc: out-of-bounds accesses inside PyTorch's cached blocks
  # would otherwise go unseen by memcheck. Only our kernels (namespace specdec) are
  # instrumented: PyTorch's own run at full speed, so the budget covers more tests.
  # shellcheck disable=SC2046
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 limited "$secs" "$STATE/sanitize-$tool.log" \
    "$(cuda_tool compute-sanitizer)" --tool "$tool" --kernel-name kns=specdec --error-exitcode 99 \
    --print-limit 30 --report-api-errors no $PY -m pytest \
    $(pytest_args "sanitize-$tool" "$secs" "${PYTEST_TIMEOUT_SANITIZER:-400}") -k "$sel" $KERNEL_TESTS
  rc=$?
  $PY scripts/gpu_check_report.py junit "$STATE/sanitize-$tool.xml" "$STATE/sanitize-$tool.log" >>"$REPORT"
  $PY scripts/gpu_check_report.py sanitizer "$STATE/sanitize-$tool.log" >>"$REPORT"
  if [ $rc -eq 99 ] || grep -q -E "ERROR SUMMARY: [1-9]|\([1-9][0-9]* errors" "$STATE/sanitize-$tool.log"; then
    note "result: **$tool found errors** (rc $rc)"; fail 1
  elif [ $rc -eq 2 ] || [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    # Time-boxed by design: stopping at the budget is no failure.
    note "result: no $tool error in the tests it reached within its budget (rc $rc)"
  else
    judge $rc "see sanitize-$tool.log"
  fi
  publish
}

stage_sanitize() {
  ensure_built || return
  local total narrow=""
  # The dry run narrows each selection to a few quick tests.
  [ "$GPU_CHECK_DRY" = 1 ] && narrow=" and (chain_matches_reference or rollback_paged)"
  total=$(left)
  # memcheck over every CUDA kernel test except torch.compile and opcheck (compilers, not our
  # kernels), the 10^6-request statistical tests (too slow under the tool) and CUDA-graph
  # capture (it cannot allocate with the caching allocator off, and a failed capture left the
  # worker's generator mid-capture: 246 later tests failed on the H200, 2026-11-26); racecheck
  # and synccheck over the reference comparisons, which launch every kernel variant.
  sanitize_with memcheck $((total / 2)) "$DEV and not compile and not opcheck and not lossless and not capture$narrow"
  total=$(left)
  sanitize_with racecheck $((total / 2)) "$DEV and matches_reference and not compile$narrow"
  sanitize_with synccheck "$(left)" "$DEV and matches_reference and not compile$narrow"
}

if [ ! -f "$REPORT" ]; then
  {
    echo "## GPU check $(date -u +%Y-%m-%d)"
    echo
    if [ "$GPU_CHECK_DRY" = 1 ]; then
      echo "**Dry run on CPU** (no GPU visible, or GPU_CHECK_DRY=1): it checks the script;"
      echo "figures here are not GPU figures."
      echo
    fi
    $PY scripts/gpu_check_report.py env
    echo "- sources: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git here'), fingerprint $(fingerprint) (\`bash scripts/gpu_check.sh fingerprint\`)"
    echo "- per-test timeout: ${PYTEST_TIMEOUT} s ($TIMEOUT_HOW)"
  } >"$REPORT"
fi

for stage in "${stages[@]}"; do
  # Budgets in seconds: on the GPU each well inside a 600 s call, together inside the
  # session's 30 minutes; a dry run's are short (its CPU build takes what it takes).
  if [ "$GPU_CHECK_DRY" = 1 ]; then
    case $stage in build) BUDGET=1200 ;; *) BUDGET=180 ;; esac
  else
    case $stage in build) BUDGET=400 ;; kernels) BUDGET=300 ;; e2e) BUDGET=300 ;; bench) BUDGET=210 ;;
      sanitize) BUDGET=240 ;; esac
  fi
  BUDGET=${GPU_CHECK_SECONDS:-$BUDGET}
  [ "$GPU_CHECK_DRY" = 0 ] && [ "$BUDGET" -gt 550 ] && BUDGET=550  # a device call ends at 600 s
  CALL_START=$(now)
  printf '\n### %s (%s, %s, budget %s s)\n\n' "$stage" "$(date -u +%H:%M:%S)" \
    "$([ "$GPU_CHECK_DRY" = 1 ] && echo 'dry run, cpu' || echo cuda)" "$BUDGET" >>"$REPORT"
  section_start=$(wc -l <"$REPORT")
  [ -n "${GPU_WARNING:-}" ] && note "$GPU_WARNING" && note ""
  "stage_$stage"
  note ""
  note "($stage took $(($(now) - CALL_START)) s; status so far $status)"
  publish
  tail -n +"$((section_start - 1))" "$REPORT"
done
n_out=$(find "$OUT_DIR" -type f | wc -l)
echo
echo "report: $OUT_DIR/gpu_check.md, logs: $OUT_DIR/gpu_check_logs.tar.gz ($n_out files under \$OUT; status $status)"
if [ "$n_out" -gt "$MAX_OUT_FILES" ]; then
  echo "gpu_check: $n_out files under $OUT_DIR, more than the $MAX_OUT_FILES the device returns" >&2
  fail 1
fi
exit $status
