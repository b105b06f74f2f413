"""Tree attention over 30 layers' own caches (default model's shape: 9 query heads, 3 KV heads,
D 64) for blocks of T = 1, 8 and 16 tokens (a chain mask), ms per 30 layers; run alternately
under two builds or settings (attn_tree_ab.sh)."""
import statistics, time
import torch
from specdec_kernels import ops
torch.manual_seed(0)
L = 30
out = []
for dtype in (torch.float32, torch.bfloat16):
    for keys in (256, 2048):
        caches = [(torch.randn(1, 3, keys + 64, 64).to(dtype), torch.randn(1, 3, keys + 64, 64).to(dtype)) for _ in range(L)]
        for T in (1, 8, 16):
            q = torch.randn(1, T, 9, 64)
            parents = torch.arange(-1, T - 1).view(1, T)
            mask = ops.build_tree_masks(parents, torch.tensor([keys - T])).packed_mask
            lens = torch.tensor([keys - T], dtype=torch.int32)
            fn = lambda: [ops.tree_attention(q, k, v, lens, mask, 0.125) for k, v in caches]
            for _ in range(3): fn()
            ts = []
            for _ in range(15):
                t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
            out.append(f"{str(dtype)[6:]}/{keys}/T{T}: {1e3*statistics.median(ts):.2f}")
print(" | ".join(out), flush=True)
