import sys, time, torch
sys.path.insert(0, '/work/main')
from specdec_kernels import ops
torch.set_num_threads(2)
ops.cpu_isa(sys.argv[1])
N, K = 3072, 576
ws = [torch.randn(N, K) for _ in range(30)]
for M in [1, 8, 12, 16]:
    x = torch.randn(M, K)
    for name, seq in [('resident', [ws[0]] * 30), ('stream', ws)]:
        best = 1e9
        for _ in range(7):
            s = time.perf_counter()
            for w in seq: torch.ops.specdec.small_batch_linear(x, w, None)
            best = min(best, (time.perf_counter() - s) / 30)
        print(sys.argv[1], M, name, f"{best*1e6:.0f} us {2*M*N*K/best/1e9:.0f} GFLOPS {N*K*4/best/1e9:.1f} GB/s")
