import time, torch, sys
from specdec_kernels import ops
torch.manual_seed(0)
isa = sys.argv[1]
print("isa", ops.cpu_isa(isa))
w = torch.randn(3072, 576)   # 7 MB: L3-resident
for M in (1, 4, 8, 12, 16, 24, 32):
    x = torch.randn(M, 576)
    for _ in range(20): ops.small_batch_linear(x, w)
    n = 200; t = time.perf_counter()
    for _ in range(n): ops.small_batch_linear(x, w)
    dt = (time.perf_counter() - t) / n
    tt = time.perf_counter()
    for _ in range(n): torch.nn.functional.linear(x, w)
    dtt = (time.perf_counter() - tt) / n
    print(f"M={M}: ours {dt*1e6:.0f} us {2*M*w.numel()/dt/1e9:.0f} GFLOPS | torch {dtt*1e6:.0f} us {2*M*w.numel()/dtt/1e9:.0f} GFLOPS")
