import time, torch, statistics
from specdec_kernels import ops
from specdec_kernels.models import load_model
from specdec_kernels.models.direct_forward import DirectForward
from specdec_kernels.models.quantized_weight import joined_rows, QuantizedWeight
model = load_model(weights="file").model
df = DirectForward(model)
calls = []
for layer in df.layers:
    for linears in layer.stack_linears(torch.float32, lambda *a: True)[0::4], :
        pass
    st = layer.stack_linears(torch.float32, lambda *a: True)
    for i in range(0, len(st), 4):
        if st[i] is not None: calls.append(tuple(st[i:i+4]))
head = df.head.weight
calls_h = [(head.qweight, head.scales, head.mins, None)]
print(len(calls), [tuple(c[0].shape) for c in calls[:4]], head.qweight.shape, head.qweight.dtype)
def run(cs, M):
    x = torch.randn(M, cs[0][0].shape[1]*32 if cs[0][0].dim()==3 else 576)
    xs = {}
    for q,s,mn,b in cs:
        K = q.shape[1]*32
        if K not in xs: xs[K] = torch.randn(M, K)
    def go():
        for q,s,mn,b in cs: ops.quantized_linear(xs[q.shape[1]*32], q, s, mn, b)
    go(); ts=[]
    for _ in range(15):
        t=time.perf_counter(); go(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)*1e3
for rnd in range(1):  # one round per process; alternate trees outside
    for M in (1, 8, 16):
        print(M, "layers %.2f ms, head %.2f ms" % (run(calls, M), run(calls_h, M)))
