import torch, time, sys
from specdec_kernels import ops
torch.manual_seed(0)
tree = __import__("specdec_kernels").__file__.rsplit("/", 2)[0]
res = {}
for N, K in [(1536, 576), (576, 1536), (576, 576), (8960, 1536)]:
    nbytes = N * K * 4
    ws = [torch.randn(N, K) for _ in range(max(2, int(200e6 // nbytes)))]
    for M in (1, 4, 5, 6, 8, 12, 16):
        x = torch.randn(M, K)
        for w in ws: ops.small_batch_linear(x, w, None)
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            for w in ws: ops.small_batch_linear(x, w, None)
            ts.append((time.perf_counter() - t) / len(ws))
        res[(N, K, M)] = min(ts) * 1e3
    print(tree, (N, K), " ".join("M=%d %.3f" % (M, res[(N, K, M)]) for M in (1, 4, 5, 6, 8, 12, 16)), flush=True)
