import torch, time, statistics
from specdec_kernels.models import load_model
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
m = load_model(weights="float32").model
c = quantized_copy(m, 4, 32)
rd = ModelRunner(c)
P = 300
cd = rd.new_cache(1, P + 64)
with torch.inference_mode():
    rd.prefill(cd, [list(range(10, 10 + P))])
    calls = {
        "fwd M=1": lambda: rd.forward(cd, torch.tensor([[42]]), [P]),
        "fwd M=2": lambda: rd.forward(cd, torch.tensor([[42, 43]]), [P]),
        "fwd M=1 prefill last": lambda: rd.forward(cd, torch.tensor([[42]]), [P], last_logits_only=True, prefill=True),
        "fwd M=2 prefill last": lambda: rd.forward(cd, torch.tensor([[42, 43]]), [P], last_logits_only=True, prefill=True),
    }
    res = {k: [] for k in calls}
    for r in range(25):
        for k, f in calls.items():
            t = time.perf_counter(); f(); dt = time.perf_counter() - t
            if r >= 3: res[k].append(dt * 1e3)
    for k, v in res.items(): print(k, "%.2f ms" % statistics.median(v))
