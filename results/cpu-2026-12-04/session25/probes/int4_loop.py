"""120 int4 layer weights (the twenty-fourth session's probe_lib) through quantized_linear, one row,
in a Python loop for 10 s, for `perf record -p PID` once /tmp/ready exists."""
import os, sys, time
sys.path.insert(0, "results/cpu-2026-12-04/session24/probes")
import torch
from probe_lib import int4_layers
layers, nbytes, call = int4_layers()
for _ in range(5): [call(q) for q in layers]
open("/tmp/ready", "w").write("1")
t = time.perf_counter(); n = 0
while time.perf_counter() - t < 10:
    for q in layers: call(q)
    n += 1
dt = 10 / n
print(f"{1e3*dt:.2f} ms for {len(layers)} calls, {nbytes/dt/1e9:.1f} GB/s")
