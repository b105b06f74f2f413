import sys, time, torch, statistics
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv)>1 else 1)
ops.cpu_isa(sys.argv[2] if len(sys.argv)>2 else "avx512_bf16")
for n,k,m in ((256,576,16),(576,576,16),(256,576,4),(96,1536,16),(3072,576,16)):
    w=torch.randn(n,k); x=torch.randn(m,k)
    for _ in range(100): ops.small_batch_linear(x,w)
    r=[]
    for _ in range(9):
        t=time.perf_counter()
        for _ in range(300): ops.small_batch_linear(x,w)
        r.append((time.perf_counter()-t)/300)
    dt=statistics.median(r)
    print(n,k,m, f"{dt*1e6:.1f} us", f"{2*n*k*m/dt/1e9:.1f} GFLOPS", f"min {2*n*k*m/min(r)/1e9:.1f}")
