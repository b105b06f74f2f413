import torch, time, sys
from specdec_kernels import ops
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv)>1 else 1)
for N,K in [(1024,576),(512,1536),(8192,576)]:
    W=torch.randn(N,K)
    for M in [1,4,6,8,12,16,32]:
        x=torch.randn(M,K)
        for _ in range(20): ops.small_batch_linear(x,W)
        reps=200
        t=time.perf_counter()
        for _ in range(reps): ops.small_batch_linear(x,W)
        dt=(time.perf_counter()-t)/reps
        print(f"N={N} K={K} M={M:2d} {dt*1e6:8.1f} us  {2*M*N*K/dt/1e9:6.1f} GFLOPS  {N*K*4/dt/1e9:6.1f} GB/s")
