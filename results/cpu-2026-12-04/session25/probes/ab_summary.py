"""Medians of attn_ab.sh's output: python3 ab_summary.py FILE."""
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    who, rest = line.split(":", 1)
    for part in rest.split("|"):
        k, v = part.rsplit(":", 1)
        d[(who.strip(), k.strip())].append(float(v))
for k in sorted({k for _, k in d}):
    b, a = statistics.median(d[("before", k)]), statistics.median(d[("after", k)])
    print(f"{k:15s} before {b:.2f} ms  after {a:.2f} ms  after/before {a / b:.3f}  (n={len(d[('after', k)])})")
