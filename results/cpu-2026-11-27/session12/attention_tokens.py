import sys, time, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
from bench.attention_prefix import _microseconds, CACHES
torch.manual_seed(0)
for rnd in range(2):
  for isa in ("avx512_bf16", "avx2"):
    ops.cpu_isa(isa)
    prefix = 512
    out = []
    for tokens in (1, 4, 5, 6, 8, 16):
        caches = [(torch.randn(1, 3, prefix + tokens, 64), torch.randn(1, 3, prefix + tokens, 64)) for _ in range(CACHES)]
        q = torch.randn(1, tokens, 9, 64)
        lens = torch.tensor([prefix])
        mask = ops.build_tree_masks(torch.arange(-1, tokens - 1).unsqueeze(0), lens).packed_mask
        turn = iter(range(10**9))
        def call():
            k, v = caches[next(turn) % CACHES]
            ops.tree_attention(q, k, v, lens, mask, 0.125)
        out.append(f"T={tokens}: {_microseconds(call, 300):6.1f}")
    print(isa, "us/layer", " ".join(out))
