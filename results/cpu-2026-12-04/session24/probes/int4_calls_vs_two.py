import time, torch
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight, pack_panels
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = []
for _ in range(30):
    layers += [pack_panels(quantize_weight(torch.randn(*s), 4, 32)) for s in shapes]
# the same bytes in 2 calls: all K=576 rows stacked, all K=1536 stacked
big576 = pack_panels(quantize_weight(torch.randn(30*(960+576+3072), 576), 4, 32))
big1536 = pack_panels(quantize_weight(torch.randn(30*576, 1536), 4, 32))
bigs = [big576, big1536]
nbytes = sum(q.nbytes_resident for q in layers); nb2 = sum(q.nbytes_resident for q in bigs)
xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
def call(q): return ops.quantized_linear(xs[q.shape[1]], q.qweight, q.scales, q.mins)
def run(ws):
    t=time.perf_counter()
    for q in ws: call(q)
    return time.perf_counter()-t
for th in (1, 2):
    torch.set_num_threads(th)
    for _ in range(3): run(layers); run(bigs)
    a=[];b=[]
    for _ in range(15): a.append(run(layers)); b.append(run(bigs))
    a.sort(); b.sort()
    print(f"threads {th}: 120 calls {1000*a[7]:.2f} ms {nbytes/a[7]/1e9:.1f} GB/s | 2 calls {1000*b[7]:.2f} ms {nb2/b[7]/1e9:.1f} GB/s")
