#!/bin/bash
# tree attention per layer (prefix 512, 9/3 heads of 64), old (main a0e9b23) and new alternated
for r in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then P=/tmp/wt-main; else P=/work/main; fi
    echo "== $side round $r"
    (cd $P && PKG=$P python3 /tmp/s12/attn_t.py 2>&1 | grep -v USDT)
  done
done
