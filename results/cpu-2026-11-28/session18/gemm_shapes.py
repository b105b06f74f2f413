import torch, time
from specdec_kernels import ops
from specdec_kernels.decoding.cpu_matmul import gemm_linear
def bench(f, n=7):
    for _ in range(2): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return sorted(ts)[n//2]
for rows in (32, 128, 512):
    for (N,K) in [(1536,576),(576,1536),(576,576),(192,576),(4096,576)]:
        x=torch.randn(rows,K); w=torch.randn(N,K)
        a=bench(lambda: ops.small_batch_linear(x,w,None)); b=bench(lambda: gemm_linear(x,w,None))
        print(rows,(N,K),"package %.3f ms onednn %.3f ms  ratio %.2f" % (a*1e3,b*1e3,b/a))
