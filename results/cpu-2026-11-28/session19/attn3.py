# fp32 model attention (q, cache fp32): before/after the kernel templating
import torch, time, sys
from specdec_kernels import ops, reference
torch.manual_seed(0)
out = []
for prefix in (256, 700, 2048):
    for T in (1, 6):
        L = 30
        ks = [torch.randn(1, 3, prefix + 16, 64) for _ in range(L)]
        vs = [torch.randn(1, 3, prefix + 16, 64) for _ in range(L)]
        q = torch.randn(1, T, 9, 64)
        lens = torch.tensor([prefix])
        mask = reference.build_tree_masks(torch.tensor([[-1] + list(range(T - 1))]), lens).packed_mask
        for i in range(L): ops.tree_attention(q, ks[i], vs[i], lens, mask)
        best = 1e9
        for _ in range(15):
            s = time.perf_counter()
            for i in range(L): ops.tree_attention(q, ks[i], vs[i], lens, mask)
            best = min(best, (time.perf_counter() - s) / L)
        out.append(f"p{prefix}/T{T} {best*1e6:6.1f}")
print(ops.cpu_isa(), sys.path[0][-8:], " ".join(out))
