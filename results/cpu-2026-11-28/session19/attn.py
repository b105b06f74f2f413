import torch, time
from specdec_kernels import ops, reference
torch.manual_seed(0)
print(ops.cpu_isa())
for prefix in (256, 700, 2048):
    for T in (1, 6):
        res = {}
        for dt in (torch.float32, torch.bfloat16):
            L = 30
            ks = [torch.randn(1, 3, prefix + 16, 64).to(dt) for _ in range(L)]
            vs = [torch.randn(1, 3, prefix + 16, 64).to(dt) for _ in range(L)]
            q = torch.randn(1, T, 9, 64)
            lens = torch.tensor([prefix])
            mask = reference.build_tree_masks(torch.tensor([[-1] + list(range(T - 1))]), lens).packed_mask
            for i in range(L): ops.tree_attention(q, ks[i], vs[i], lens, mask)
            best = 1e9
            for _ in range(15):
                s = time.perf_counter()
                for i in range(L): ops.tree_attention(q, ks[i], vs[i], lens, mask)
                best = min(best, (time.perf_counter() - s) / L)
            res[str(dt)[6:]] = best * 1e6
        print(f"prefix {prefix:5d} T {T}: " + "  ".join(f"{k} {v:6.1f} us" for k, v in res.items()), f" ratio {res['bfloat16']/res['float32']:.2f}")
