#!/usr/bin/env bash
# Alternates forward_ab.py between a tree of the old code ($1) and the new ($2), $3 rounds
# each (ISA: SPECDEC_CPU_ISA etc. in the environment); summarise with ab_summary.py.
P=$(dirname "$0")/forward_ab.py
for i in $(seq "${3:-4}"); do
  echo -n "before: "; PYTHONPATH=$1 python3 "$P" 2>/dev/null
  echo -n "after:  "; PYTHONPATH=$2 python3 "$P" 2>/dev/null
done
