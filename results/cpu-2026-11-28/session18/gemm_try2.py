import torch, time
torch.manual_seed(0)
print(torch.ops.mkldnn._reorder_linear_weight.default._schema)
print(torch.ops.mkldnn._linear_pointwise.default._schema)
def bench(f, n=10):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return sorted(ts)[n//2]
for (M,K,N) in [(659,576,1536),(659,1536,576),(659,576,576),(128,576,1536)]:
    x=torch.randn(M,K); w=torch.randn(N,K); fl=2*M*K*N/1e9
    pw = torch.ops.mkldnn._reorder_linear_weight(w, M)
    t = bench(lambda: torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], ""))
    t2 = bench(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    ref = x @ w.t()
    err = (torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "") - ref).abs().max().item()
    print((M,K,N), "packed %.2f ms %.0f GF, unpacked %.2f ms %.0f GF, err %.2e" % (t*1e3, fl/t, t2*1e3, fl/t2, err))
