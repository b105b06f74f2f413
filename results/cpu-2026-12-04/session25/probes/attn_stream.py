"""One-token tree attention over 30 layers' own caches (the default model's shape: 9 query
heads, 3 KV heads, D 64), so the K/V stream from memory as in a decoding step: GB/s by
prefix length, cache dtype and threads; beside torch.sum over the same bytes."""
import statistics, sys, time
import torch
from specdec_kernels import ops

def med(fn, n=15):
    for _ in range(3): fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

torch.manual_seed(0)
L = 30
q = torch.randn(1, 1, 9, 64)
mask = torch.ones(1, 1, 1, dtype=torch.int32)
for dtype in (torch.float32, torch.bfloat16):
    for keys in (512, 1024, 2048, 3072):
        S = keys + 64
        caches = [(torch.randn(1, 3, S, 64).to(dtype), torch.randn(1, 3, S, 64).to(dtype)) for _ in range(L)]
        lens = torch.tensor([keys - 1], dtype=torch.int32)
        nbytes = L * 2 * 3 * keys * 64 * caches[0][0].element_size()
        for th in (2, 1):
            torch.set_num_threads(th)
            dt = med(lambda: [ops.tree_attention(q, k, v, lens, mask, 0.125) for k, v in caches])
            ds = med(lambda: [(k[:, :, :keys].sum(), v[:, :, :keys].sum()) for k, v in caches])
            print(f"{str(dtype)[6:]:9s} keys {keys:5d} threads {th}: attention {1e3*dt:6.2f} ms "
                  f"({nbytes/dt/1e9:5.1f} GB/s, {1e6*dt/L:6.1f} us a layer); torch.sum {nbytes/ds/1e9:5.1f} GB/s", flush=True)
        del caches
