# Engine cost curves, before (/tmp/bt20) and now, alternating; AVX-512.
for round in 1 2; do
  for tree in /tmp/bt20 /work/main; do
    tag=$(basename $tree)-$round
    (cd $tree && python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --prefix 512 --tokens 1,8,16 --repeats 9 --out /tmp/s20/cc135-$tag.json > /dev/null 2>&1)
    python3 -c "import json; d=json.load(open('/tmp/s20/cc135-$tag.json')); m=d['models']['135m']; print('$tag 135m', m['latency_ms'], m['relative_cost'])"
  done
done
for tree in /tmp/bt20 /work/main; do
  tag=$(basename $tree)
  (cd $tree && python3 -m bench.cost_curve --device cpu --dtype float32 --models 1.5b --tokens 1,8,16 --repeats 3 --out /tmp/s20/cc15-$tag.json > /dev/null 2>&1)
  python3 -c "import json; d=json.load(open('/tmp/s20/cc15-$tag.json')); m=d['models']['1.5b']; print('$tag 1.5b', m['latency_ms'], m['relative_cost'])"
done
