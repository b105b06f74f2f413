import sys, time, torch
sys.path.insert(0, '/work/main')
from specdec_kernels import ops
from specdec_kernels.tree import pack_tree_mask
torch.set_num_threads(2)
import torch.nn.functional as F
for isa in sys.argv[1:]:
    ops.cpu_isa(isa)
    for T in [256, 768, 1536]:
        q = torch.randn(1, T, 9, 64); k = torch.randn(1, 3, T, 64); v = torch.randn(1, 3, T, 64)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        packed = pack_tree_mask(causal[None])
        lens = torch.zeros(1, dtype=torch.int64)
        def ours(): return ops.tree_attention(q, k, v, lens, packed, 0.125)
        def sd(): return F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=0.125, enable_gqa=True).transpose(1, 2)
        a, b = ours(), sd()
        err = (a - b).abs().max().item()
        res = {}
        for name, fn in [('ours', ours), ('sdpa', sd)] * 2:
            best = 1e9
            for _ in range(5):
                s = time.perf_counter(); fn(); best = min(best, time.perf_counter() - s)
            res[name] = best * 1e3
        fl = T * T / 2 * 9 * 64 * 4
        print(isa, T, {k: f"{v:.2f} ms {fl / v / 1e6:.0f} GFLOPS" for k, v in res.items()}, 'maxerr', err)
