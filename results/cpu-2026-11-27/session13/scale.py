import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
ops.cpu_isa(sys.argv[1])
M = int(sys.argv[2])
for N in (1536, 3072, 6144, 12288, 24576, 49152):
    w = torch.randn(N, 576); x = torch.randn(M, 576)
    res = {}
    for r in range(5):
        for th in (1, 2):
            torch.set_num_threads(th)
            reps = max(5, int(3e7 / (N * 576)))
            ops.small_batch_linear(x, w)
            t = time.perf_counter()
            for _ in range(reps): ops.small_batch_linear(x, w)
            res.setdefault(th, []).append((time.perf_counter() - t) / reps * 1e6)
    a, b = statistics.median(res[1]), statistics.median(res[2])
    print(f"M={M} N={N:6d}: 1 thread {a:8.1f} us, 2 threads {b:8.1f} us, scaling {a/b:4.2f}  ({2*M*N*576/b/1e3:5.1f} GFLOPS)")
