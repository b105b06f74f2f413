import time, torch, sys
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight, pack_panels
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate/up, down
layers = []
for _ in range(30):
    layers += [pack_panels(quantize_weight(torch.randn(*s), 4, 32)) for s in shapes]
nbytes = sum(q.nbytes_resident for q in layers)
print("MB", nbytes/1e6, layers[0].qweight.shape)
xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
def call(q): return ops.quantized_linear(xs[q.shape[1]], q.qweight, q.scales, q.mins)
for th in (1, 2):
    torch.set_num_threads(th)
    for _ in range(3):
        for q in layers: call(q)
    ts=[]
    for _ in range(15):
        t=time.perf_counter()
        for q in layers: call(q)
        ts.append(time.perf_counter()-t)
    ts.sort(); med=ts[7]
    print(f"threads {th}: stream {1000*med:.2f} ms for {len(layers)} calls, {nbytes/med/1e9:.1f} GB/s, {1e6*med/len(layers):.1f} us/call")
    for i in (0, 2):
        one = layers[i]
        for _ in range(50): call(one)
        n=1000; t=time.perf_counter()
        for _ in range(n): call(one)
        dt=(time.perf_counter()-t)/n
        print(f"   resident {tuple(one.shape)}: {dt*1e6:.1f} us/call, {one.nbytes_resident/dt/1e9:.1f} GB/s")
