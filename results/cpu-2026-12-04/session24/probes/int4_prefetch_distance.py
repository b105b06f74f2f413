"""The 120 streamed int4 layer weights at one row, 2 threads, for a build whose panel tile
reads its prefetch distance from SPECDEC_QPF / SPECDEC_QPS (a temporary edit, see README)."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import int4_layers, median_seconds

layers, nbytes, call = int4_layers()
torch.set_num_threads(2)
med = median_seconds(lambda: [call(q) for q in layers], 21, warm=3)
print(f"QPF={os.environ.get('SPECDEC_QPF','16')} QPS={os.environ.get('SPECDEC_QPS','0')}: {1000*med:.3f} ms {nbytes/med/1e9:.1f} GB/s")
