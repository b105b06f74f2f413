import time, torch, sys
from specdec_kernels import ops
torch.manual_seed(0)
# a stream of distinct weights bigger than L3: 30 x (1536 x 576) x 3 + ...
ws = [torch.randn(1536, 576) for _ in range(120)]  # 424 MB
x = torch.randn(1, 576)
for th in (1, 2):
    torch.set_num_threads(th)
    for _ in range(2):
        for w in ws: ops.small_batch_linear(x, w)
    ts=[]
    for _ in range(9):
        t=time.perf_counter()
        for w in ws: ops.small_batch_linear(x, w)
        ts.append(time.perf_counter()-t)
    ts.sort(); med=ts[4]
    print(f"threads {th}: sbl {sum(w.numel() for w in ws)*4/med/1e9:.1f} GB/s", end="; ")
    ts=[]
    for _ in range(9):
        t=time.perf_counter()
        for w in ws: torch.nn.functional.linear(x, w)
        ts.append(time.perf_counter()-t)
    ts.sort(); med=ts[4]
    print(f"torch linear {sum(w.numel() for w in ws)*4/med/1e9:.1f} GB/s", end="; ")
    ts=[]
    for _ in range(9):
        t=time.perf_counter()
        for w in ws: w.sum()
        ts.append(time.perf_counter()-t)
    ts.sort(); med=ts[4]
    print(f"sum {sum(w.numel() for w in ws)*4/med/1e9:.1f} GB/s")
