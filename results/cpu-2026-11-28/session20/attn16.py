import torch, time
from specdec_kernels import ops
from bench.attention_prefix import _microseconds, CACHES
torch.manual_seed(0)
for isa in ("avx512_bf16", "avx2"):
    ops.cpu_isa(isa)
    for tokens in (1, 8, 16):
        prefix = 512
        caches = [(torch.randn(1, 3, prefix + tokens, 64), torch.randn(1, 3, prefix + tokens, 64)) for _ in range(CACHES)]
        q = torch.randn(1, tokens, 9, 64)
        lens = torch.tensor([prefix])
        mask = ops.build_tree_masks(torch.arange(-1, tokens - 1).unsqueeze(0), lens).packed_mask
        turn = iter(range(10**9))
        def call():
            k, v = caches[next(turn) % CACHES]
            ops.tree_attention(q, k, v, lens, mask, 0.125)
        us = _microseconds(call, 300)
        gflop = 2 * 2 * tokens * 9 * (prefix + tokens) * 64 / 1e9
        print(f"{isa:12s} prefix {prefix} T={tokens:2d}: {us:7.1f} us a layer, x30 = {30*us/1000:5.2f} ms, {gflop/us*1e6:6.1f} GFLOPS")
ops.cpu_isa("none")
