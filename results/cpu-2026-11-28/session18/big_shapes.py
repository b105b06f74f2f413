"""small_batch_linear on the 1.5b shapes, weights streaming from memory (cycled copies > 200 MB), GFLOPS and GB/s."""
import torch, time, statistics, sys
from specdec_kernels import ops
torch.manual_seed(0)
shapes = [(1536, 1536), (8960, 1536), (1536, 8960), (4096, 576), (1536, 576), (576, 1536)]
for N, K in shapes:
    nbytes = N * K * 4
    copies = max(2, int(256e6 // nbytes))
    ws = [torch.randn(N, K) for _ in range(copies)]
    line = []
    for M in (1, 8, 16):
        x = torch.randn(M, K)
        for w in ws: ops.small_batch_linear(x, w, None)
        ts = []
        for r in range(3):
            t = time.perf_counter()
            for w in ws: ops.small_batch_linear(x, w, None)
            ts.append((time.perf_counter() - t) / len(ws))
        dt = min(ts)
        line.append("M=%d %.3f ms %.0f GB/s %.0f GFLOPS" % (M, dt * 1e3, nbytes / dt / 1e9, 2 * M * N * K / dt / 1e9))
    print((N, K), " | ".join(line), flush=True)
