#!/usr/bin/env bash
# Alternates decode_ab.py between the build before ($1) and after ($2), $3 rounds (ISA from the
# environment).
P=$(dirname "$0")/decode_ab.py
for i in $(seq "${3:-3}"); do
  echo -n "before: "; PYTHONPATH=$1 python3 "$P" 6 96 2>/dev/null | tail -1
  echo -n "after:  "; PYTHONPATH=$2 python3 "$P" 6 96 2>/dev/null | tail -1
done
