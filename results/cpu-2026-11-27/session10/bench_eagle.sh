#!/usr/bin/env bash
# EAGLE before (main, worktree at $OLD) and after (this branch), 36 dev prompts, AVX-512 path;
# then this branch on the AVX2 path (12 prompts).
set -e
OLD=${OLD:-/tmp/wt-main}
NEW=${NEW:-/work/main}
R=$NEW/results/cpu-2026-11-27/session10
B="python3 -m specdec_kernels.bench --max-new-tokens 128"
(cd "$NEW" && PYTHONPATH="$NEW" $B --methods ours-autoregressive,ours-eagle --prompts-per-category 6 --out "$R/bench6-new")
(cd "$OLD" && PYTHONPATH="$OLD" $B --methods ours-autoregressive,ours-eagle --prompts-per-category 6 --out "$R/bench6-old")
(cd "$NEW" && SPECDEC_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 PYTHONPATH="$NEW" $B --methods hf-generate,ours-autoregressive,ours-medusa,ours-eagle --prompts-per-category 2 --out "$R/bench-avx2")
