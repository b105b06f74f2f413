#!/bin/bash
# old (main a0e9b23, /tmp/wt-main) against new (working tree), alternated 3 times
for r in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then P=/tmp/wt-main; else P=/work/main; fi
    echo "== $side round $r"
    (cd $P && PKG=$P python3 /tmp/s12/verify_ab.py avx512_bf16,avx2 1)
  done
done
