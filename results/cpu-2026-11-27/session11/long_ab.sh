#!/usr/bin/env bash
# Plain decoding and EAGLE on the long-prompt categories: main (worktree at $OLD) against this
# branch, alternated twice (eleventh session: the tree-attention prefetch and split schedule).
set -e
OLD=${OLD:-/tmp/wt-main}
NEW=${NEW:-/work/main}
R=$NEW/results/cpu-2026-11-27/session11
B="python3 -m specdec_kernels.bench --methods ours-autoregressive,ours-eagle --categories rag,summarization --prompts-per-category 3 --max-new-tokens 64"
for i in 1 2; do
  (cd "$OLD" && PYTHONPATH="$OLD" $B --out "$R/long-main-$i")
  (cd "$NEW" && PYTHONPATH="$NEW" $B --out "$R/long-new-$i")
done
