import torch, time
from specdec_kernels import ops
torch.manual_seed(0)
for N, K in [(8960, 1536), (1536, 8960), (1536, 1536), (576, 1536)]:
    nbytes = N * K * 4
    ws = [torch.randn(N, K) for _ in range(max(2, int(256e6 // nbytes)))]
    for Kb in (None, 512, 768):
        line = []
        for M in (1, 8, 16):
            x = torch.randn(M, K)
            if Kb is None:
                f = lambda w: ops.small_batch_linear(x, w, None)
            else:
                xs = [x[:, k:k + Kb].contiguous() for k in range(0, K, Kb)]
                def f(w):
                    out = None
                    for i, k in enumerate(range(0, K, Kb)):
                        r = ops.small_batch_linear(xs[i], w[:, k:k + Kb], None)
                        out = r if out is None else out.add_(r)
                    return out
            for w in ws: f(w)
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                for w in ws: f(w)
                ts.append((time.perf_counter() - t) / len(ws))
            dt = min(ts)
            line.append("M=%d %.3f ms" % (M, dt * 1e3))
        print((N, K), "Kb", Kb, " | ".join(line), flush=True)
