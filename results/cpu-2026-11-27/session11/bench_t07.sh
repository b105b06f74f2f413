#!/usr/bin/env bash
# EAGLE at temperature 0.7, top-p 0.9: main (worktree at $OLD) then this branch, 12 dev prompts.
# Eleventh session: OUT_OLD=bench-t07-main OUT_NEW=bench-t07-race (exponential_), then
# OUT_OLD=bench-t07-main2 OUT_NEW=bench-t07-uniform (uniform draws and a log), then
# OUT_OLD=bench-t07-main3 OUT_NEW=bench-t07-rates (depths valued by measured acceptance).
set -e
OLD=${OLD:-/tmp/wt-main}
NEW=${NEW:-/work/main}
R=$NEW/results/cpu-2026-11-27/session11
B="python3 -m specdec_kernels.bench --max-new-tokens 128 --temperature 0.7 --top-p 0.9 --seed 0 --methods ours-autoregressive,ours-eagle --prompts-per-category 2"
(cd "$OLD" && PYTHONPATH="$OLD" $B --out "$R/${OUT_OLD:-bench-t07-old}")
(cd "$NEW" && PYTHONPATH="$NEW" $B --out "$R/${OUT_NEW:-bench-t07-new}")
