"""One-row float32 linears over 120 streamed 1536 x 576 weights (424 MB), 1 and 2 threads: the
package's kernel against torch's linear and a plain sum over the same bytes."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import median_seconds
from specdec_kernels import ops

torch.manual_seed(0)
ws = [torch.randn(1536, 576) for _ in range(120)]
x = torch.randn(1, 576)
nbytes = sum(w.numel() for w in ws) * 4
paths = {"sbl": lambda w: ops.small_batch_linear(x, w),
         "torch linear": lambda w: torch.nn.functional.linear(x, w), "sum": lambda w: w.sum()}
for th in (1, 2):
    torch.set_num_threads(th)
    rates = {name: nbytes / median_seconds(lambda: [f(w) for w in ws], 9) / 1e9 for name, f in paths.items()}
    print(f"threads {th}: " + "; ".join(f"{name} {gbs:.1f} GB/s" for name, gbs in rates.items()))
