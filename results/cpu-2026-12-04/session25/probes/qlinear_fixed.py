"""Fixed cost of one quantized_linear call (int4 panels, one row) by weight size and threads,
beside a float small_batch_linear and torch.add of the same tiny row (the dispatch floor)."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from specdec_kernels import ops
from probe_lib import median_us as med
from specdec_kernels.models.quantized_weight import pack_panels, quantize_weight


torch.manual_seed(0)
for th in (1, 2, 1, 2):
    torch.set_num_threads(th)
    row = [f"threads {th}:"]
    x = torch.randn(1, 576)
    row.append(f"add {med(lambda: torch.add(x, x)):.1f}")
    for n in (16, 64, 576, 960, 3072):
        q = pack_panels(quantize_weight(torch.randn(n, 576), 4, 32))
        row.append(f"int4 {n}x576 {med(lambda: ops.quantized_linear(x, q.qweight, q.scales, q.mins)):.1f}")
    w = torch.randn(16, 576)
    row.append(f"f32 16x576 {med(lambda: ops.small_batch_linear(x, w, None)):.1f}")
    print("  ".join(row), "(us)", flush=True)
