"""The same int4 bytes in 120 layer-sized calls or 2 stacked ones, 1 and 2 threads."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import LAYER_SHAPES, int4_layers, median_seconds
from specdec_kernels.models.quantized_weight import pack_panels, quantize_weight

layers, nbytes, call = int4_layers()
rows576 = 30 * sum(n for n, k in LAYER_SHAPES if k == 576)
bigs = [pack_panels(quantize_weight(torch.randn(rows576, 576), 4, 32)),
        pack_panels(quantize_weight(torch.randn(30 * 576, 1536), 4, 32))]
nb2 = sum(q.nbytes_resident for q in bigs)
for th in (1, 2):
    torch.set_num_threads(th)
    a = median_seconds(lambda: [call(q) for q in layers], 15, warm=3)
    b = median_seconds(lambda: [call(q) for q in bigs], 15, warm=3)
    print(f"threads {th}: 120 calls {1000*a:.2f} ms {nbytes/a/1e9:.1f} GB/s | 2 calls {1000*b:.2f} ms {nb2/b/1e9:.1f} GB/s")
