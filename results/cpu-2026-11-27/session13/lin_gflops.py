import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
isa = sys.argv[1]; threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
torch.set_num_threads(threads)
ops.cpu_isa(isa)
torch.manual_seed(0)
shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [(1536, 576), (576, 1536), (49152, 576)]
for N, K in shapes:
    w = torch.randn(N, K)
    for M in (1, 4, 8, 16, 32):
        x = torch.randn(M, K)
        def f(): ops.small_batch_linear(x, w)
        def g(): torch.nn.functional.linear(x, w)
        ts = {"ours": [], "torch": []}
        reps = max(3, int(2e8 / (N * K * max(M, 4))))
        for r in range(5):
            for name, fn in (("ours", f), ("torch", g)):
                fn()
                t = time.perf_counter()
                for _ in range(reps): fn()
                ts[name].append((time.perf_counter() - t) / reps)
        o, tt = statistics.median(ts["ours"]), statistics.median(ts["torch"])
        print(f"{N}x{K} M={M:2d}: ours {o*1e6:8.1f} us {2*M*N*K/o/1e9:6.1f} GFLOPS {N*K*4/o/1e9:5.1f} GB/s | torch {tt*1e6:8.1f} us {2*M*N*K/tt/1e9:6.1f} GFLOPS")
