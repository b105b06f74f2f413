"""120 streamed int4 layer weights at one row: in their own allocations, laid end to end in
one buffer of 4 KB pages, and in one huge-page buffer, alternating. Argument: threads (2)."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import anon_huge_pages, copies_in_buffer, int4_layers, median_seconds
from specdec_kernels import ops

layers, nbytes, _ = int4_layers()
parts = [t for q in layers for t in (q.qweight, q.scales, q.mins)]
raw_h, huge = copies_in_buffer(parts, huge=True)
raw_s, small = copies_in_buffer(parts, huge=False)
print(anon_huge_pages())
xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
sets = {"separate": parts, "arena 4K": small, "arena huge": huge}
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

def run(flat):
    for i in range(0, len(flat), 3):
        w, s, m = flat[i:i + 3]
        ops.quantized_linear(xs[w.shape[1] * 32], w, s, m)

res = {name: [] for name in sets}
for _ in range(25):  # interleaved rounds
    for name, flat in sets.items():
        res[name].append(median_seconds(lambda: run(flat), 1, warm=0))
for name, v in res.items():
    v.sort(); print(f"{name}: median {1000*v[12]:.2f} ms ({nbytes/v[12]/1e9:.1f} GB/s), q1 {1000*v[6]:.2f}")
