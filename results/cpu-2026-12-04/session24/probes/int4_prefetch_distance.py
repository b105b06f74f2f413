import time, torch, sys, os
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight, pack_panels
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = []
for _ in range(30):
    layers += [pack_panels(quantize_weight(torch.randn(*s), 4, 32)) for s in shapes]
nbytes = sum(q.nbytes_resident for q in layers)
xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
def call(q): return ops.quantized_linear(xs[q.shape[1]], q.qweight, q.scales, q.mins)
torch.set_num_threads(2)
for _ in range(3):
    for q in layers: call(q)
ts=[]
for _ in range(21):
    t=time.perf_counter()
    for q in layers: call(q)
    ts.append(time.perf_counter()-t)
ts.sort(); med=ts[10]
print(f"QPF={os.environ.get('SPECDEC_QPF','16')} QPS={os.environ.get('SPECDEC_QPS','0')}: {1000*med:.3f} ms {nbytes/med/1e9:.1f} GB/s")
