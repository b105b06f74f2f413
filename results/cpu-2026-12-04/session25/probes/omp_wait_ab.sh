#!/usr/bin/env bash
# The forwards of forward_ab.py with OpenMP's default wait policy (before) and with
# OMP_WAIT_POLICY=active (after: idle threads spin instead of sleeping), $1 rounds, this build.
P=$(dirname "$0")/forward_ab.py
for i in $(seq "${1:-4}"); do
  echo -n "before: "; PYTHONPATH=. python3 "$P" 2>/dev/null
  echo -n "after:  "; OMP_WAIT_POLICY=active PYTHONPATH=. python3 "$P" 2>/dev/null
done
