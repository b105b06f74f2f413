#!/bin/bash
# the engine's T-token step against its linears alone: old (main a0e9b23) and new alternated
ISA=$1
for r in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then P=/tmp/wt-main; else P=/work/main; fi
    echo "== $side round $r $ISA"
    (cd $P && PKG=$P SPECDEC_CPU_ISA=$ISA python3 /tmp/s12/t8_split.py $ISA 2>&1 | grep -v USDT)
  done
done
