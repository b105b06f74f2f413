import sys, time, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
torch.set_num_threads(2)
ops.cpu_isa(sys.argv[1])
mask = torch.ones(1, 1, 1, dtype=torch.int32)
keys = 768
q = torch.randn(1, 1, 9, 64)
kv = [(torch.randn(1, 3, keys + 1, 64).to(torch.bfloat16), torch.randn(1, 3, keys + 1, 64).to(torch.bfloat16)) for _ in range(30)]
lens = torch.tensor([keys])
s = time.perf_counter()
for rep in range(400):
    for k, v in kv: ops.tree_attention(q, k, v, lens, mask, 0.125)
print((time.perf_counter() - s) / 400 / 30 * 1e6, 'us')
