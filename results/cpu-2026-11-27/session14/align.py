import sys, torch
sys.path.insert(0, "/work/main")
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight
torch.manual_seed(0)
for (N, K) in [(576, 576), (1536, 576), (576, 1536), (49152 // 8, 576)]:
    w = torch.randn(N, K) * 0.05
    q = quantize_weight(w, 4, 32)
    qw, sc = q.qweight if hasattr(q, "qweight") else q[0], q.scales if hasattr(q, "scales") else q[1]
    mins = getattr(q, "mins", None)
    base = torch.randn(1, K)
    outs = []
    for off in range(0, 17):
        buf = torch.empty(K + 64)
        x = buf[off: off + K].view(1, K)
        x.copy_(base)
        outs.append(ops.quantized_linear(x, qw, sc, mins))
        outs.append(ops.small_batch_linear(x, w))
    ql = [o for i, o in enumerate(outs) if i % 2 == 0]; sl = [o for i, o in enumerate(outs) if i % 2 == 1]
    print(N, K, "quantized same across alignments:", all(torch.equal(ql[0], o) for o in ql),
          "fp32 same:", all(torch.equal(sl[0], o) for o in sl))
