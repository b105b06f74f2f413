"""The default model's float32 linears (211 weights, 538 MB) at M rows: their own allocations
against one huge-page buffer, alternating. Argument: M (1)."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import LAYER_SHAPES, anon_huge_pages, copies_in_buffer, median_seconds
from specdec_kernels import ops

torch.manual_seed(0)
ws = [torch.randn(*s) for _ in range(30) for s in LAYER_SHAPES] + [torch.randn(49152, 576)]
raw_h, huge = copies_in_buffer(ws, huge=True)
print(anon_huge_pages())
nbytes = sum(w.numel() * 4 for w in ws)
M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
xs = {576: torch.randn(M, 576), 1536: torch.randn(M, 1536)}
res = {"separate": [], "arena huge": []}
for _ in range(15):
    for name, wl in (("separate", ws), ("arena huge", huge)):
        res[name].append(median_seconds(lambda: [ops.small_batch_linear(xs[w.shape[1]], w) for w in wl], 1, warm=0))
for k, v in res.items():
    v.sort(); print(f"M={M} {k}: median {1000*v[7]:.2f} ms ({nbytes/v[7]/1e9:.1f} GB/s), q1 {1000*v[3]:.2f}")
