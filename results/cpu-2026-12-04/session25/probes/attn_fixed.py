"""One-token tree attention at the default model's shape (9 query heads, 3 KV heads, D 64):
its time by prefix length and threads, against the floor of an empty parallel region."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from specdec_kernels import ops
from probe_lib import median_us as med

torch.manual_seed(0)
S = 4096
k = torch.randn(1, 3, S, 64); v = torch.randn(1, 3, S, 64)
q = torch.randn(1, 1, 9, 64)
mask = torch.ones(1, 1, 1, dtype=torch.int32)
small = torch.randn(1, 8)
for th in (2, 1, 2, 1):
    torch.set_num_threads(th)
    row = [f"threads {th}:"]
    row.append(f"torch.add tiny {med(lambda: torch.add(small, small)):.1f}us")
    for n in (64, 256, 511, 512, 1024, 2048):
        lens = torch.tensor([n - 1], dtype=torch.int32)
        row.append(f"keys {n}: {med(lambda: ops.tree_attention(q, k, v, lens, mask, 0.125)):.1f}us")
    print("  ".join(row), flush=True)
