import sys, time, torch, statistics
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
torch.set_num_threads(1)
ops.cpu_isa("avx512_bf16")
n,k,m=576,576,16
wb=torch.randn(n*k+8192); xb=torch.randn(m*k+8192)
def t(w,x):
    for _ in range(30): ops.small_batch_linear(x,w)
    r=[]
    for _ in range(5):
        s=time.perf_counter()
        for _ in range(100): ops.small_batch_linear(x,w)
        r.append((time.perf_counter()-s)/100)
    return 2*n*k*m/statistics.median(r)/1e9
print("w data ptr mod 4096", wb.data_ptr()%4096, "x", xb.data_ptr()%4096)
for wo in range(0,1024,128):
    row=[]
    for xo in range(0,1024,128):
        w=wb[wo:wo+n*k].view(n,k); x=xb[xo:xo+m*k].view(m,k)
        row.append(t(w,x))
    print(f"w+{wo*4:5d}B", " ".join(f"{g:5.0f}" for g in row))
