import os, statistics, sys, time, torch
from specdec_kernels import ops
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
W = [torch.randn(n, k) * 0.02 for n, k in shapes]
rows = (1, 2, 3)
xs = {m: {k: torch.randn(m, k) for k in (576, 1536)} for m in rows}
times = {}
for _ in range(int(sys.argv[1])):
    for v in ("old", "new"):
        if v == "old": os.environ["AB_FEW_OFF"] = "1"; os.environ.pop("AB_AVX2_FEW", None)
        else: os.environ.pop("AB_FEW_OFF", None); os.environ["AB_AVX2_FEW"] = "1"
        for m in rows:
            t = time.perf_counter()
            for w in W: ops.small_batch_linear(xs[m][w.shape[1]], w)
            times.setdefault((v, m), []).append((time.perf_counter() - t) * 1e3)
for v in ("old", "new"):
    b = statistics.median(times[(v, 1)])
    print(v, " ".join(f"M={m}: {statistics.median(times[(v, m)]):.2f} ms ({statistics.median(times[(v, m)]) / b:.3f})" for m in rows))
print("new/old", {m: round(statistics.median(times[("new", m)]) / statistics.median(times[("old", m)]), 3) for m in rows})
