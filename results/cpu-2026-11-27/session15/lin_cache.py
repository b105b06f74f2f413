# small_batch_linear with weights in cache (one 576x576 or 960x576 matrix, repeated): the tile's compute rate.
import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
th = int(sys.argv[1]); torch.set_num_threads(th)
for isa in ("avx512_bf16", "avx2"):
    ops.cpu_isa(isa)
    for n, k in ((576, 576), (960, 576), (576, 1536)):
        w = torch.randn(n, k)
        for m in (1, 4, 8, 16):
            x = torch.randn(m, k)
            ts = []
            for r in range(7):
                t = time.perf_counter()
                for _ in range(50): ops.small_batch_linear(x, w)
                ts.append((time.perf_counter() - t) / 50)
            t = statistics.median(ts)
            print(f"{isa:12s} th{th} {n}x{k} M={m:2d}: {t*1e6:7.1f} us {2*m*n*k/t/1e9:6.1f} GFLOPS")
