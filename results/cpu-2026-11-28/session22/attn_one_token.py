"""One token's attention per layer (the default model's shape: 9 query heads over 3 KV heads,
head size 64) against the cached keys, float32 and bfloat16 caches, on the path given, and
the bytes per second that makes. Usage: attn_one_token.py ISA"""
import statistics, sys, time
import torch
sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else "/work/main")
from specdec_kernels import ops

torch.set_num_threads(2)
ops.cpu_isa(sys.argv[1])
mask = torch.ones(1, 1, 1, dtype=torch.int32)
for dtype in (torch.float32, torch.bfloat16):
    for keys in (256, 512, 768, 1024, 2048):
        q = torch.randn(1, 1, 9, 64)
        # 30 layers' caches, cycled, so they are not all in cache as a layer's are not
        kv = [(torch.randn(1, 3, keys + 1, 64).to(dtype), torch.randn(1, 3, keys + 1, 64).to(dtype)) for _ in range(30)]
        lens = torch.tensor([keys])
        ts = []
        for rep in range(7):
            s = time.perf_counter()
            for k, v in kv:
                ops.tree_attention(q, k, v, lens, mask, 0.125)
            ts.append((time.perf_counter() - s) / 30)
        t = statistics.median(ts)
        size = 2 * 3 * (keys + 1) * 64 * (4 if dtype == torch.float32 else 2)
        print(f"{sys.argv[1]:12s} {str(dtype)[6:]:9s} keys {keys:5d}: {t * 1e6:6.1f} us a layer, {size / t / 1e9:5.1f} GB/s")
