import torch
from specdec_kernels.models import load_model
from specdec_kernels.models.quantized_weight import quantize_weight
m = load_model(weights="float32").model
ws = [(n, mod.weight.detach()) for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)]
worst = []
for n, w in ws[:8] + ws[-3:]:
    e = {}
    for g in (32, 64):
        q = quantize_weight(w, 4, g)
        d = q.dequantize().float()
        e[g] = ((d - w).norm() / w.norm()).item()
    # manual g64 reference: asymmetric min/max per 64
    W = w.reshape(w.shape[0], -1, 64); lo = W.amin(-1, keepdim=True); hi = W.amax(-1, keepdim=True)
    s = (hi - lo) / 15; qv = ((W - lo) / s.clamp_min(1e-12)).round().clamp(0, 15); man = (qv * s + lo).reshape_as(w)
    print(n, tuple(w.shape), "rel err g32 %.4f g64 %.4f manual-g64 %.4f" % (e[32], e[64], ((man - w).norm() / w.norm()).item()))
