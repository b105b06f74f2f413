#!/usr/bin/env bash
# A/B of the EAGLE drafter's forward: main (old) against this branch (new, float32 and
# bfloat16 draft), two rounds, each process with its own plain-loop baseline.
set -e
OLD=${OLD:-/tmp/wt-main}
NEW=${NEW:-/work/main}
for round in 1 2; do
  echo "== round $round: old ($OLD)"
  (cd "$OLD" && PYTHONPATH="$OLD" python3 bench/eagle_step_split.py 2>&1 | grep -v Loading)
  echo "== round $round: new ($NEW)"
  (cd "$NEW" && PYTHONPATH="$NEW" python3 bench/eagle_step_split.py --eagle '{}' --eagle '{"draft_dtype": "bfloat16"}' 2>&1 | grep -v Loading)
done
