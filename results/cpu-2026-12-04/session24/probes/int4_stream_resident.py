"""The int4 panel kernel at one row: 120 layer weights streamed from memory against one
weight resident in cache, 1 and 2 threads."""
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import torch
from probe_lib import int4_layers, median_seconds

layers, nbytes, call = int4_layers()
for th in (1, 2):
    torch.set_num_threads(th)
    med = median_seconds(lambda: [call(q) for q in layers], 15, warm=3)
    print(f"threads {th}: stream {1000*med:.2f} ms for {len(layers)} calls, {nbytes/med/1e9:.1f} GB/s, {1e6*med/len(layers):.1f} us/call")
    for one in (layers[0], layers[2]):
        dt = median_seconds(lambda: call(one), 1000, warm=50)
        print(f"   resident {tuple(one.shape)}: {dt*1e6:.1f} us/call, {one.nbytes_resident/dt/1e9:.1f} GB/s")
