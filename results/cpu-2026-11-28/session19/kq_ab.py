"""In one process: the 1.5B-shape file with K-quant panel scales (as loaded) against the same
weights with float32 panel scales, alternating: a 700-token prefill and one decoding token."""
import time, statistics, torch
from specdec_kernels import ops, reference
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from specdec_kernels.models.quantized_weight import QuantizedWeight, set_weight, lay_out_projections
m = load_model("/tmp/s19/qwen15b-shape.gguf", weights="file").model
import copy
def float_scales(model):
    memo = {}
    for mod in model.modules():
        for name, b in list(mod._buffers.items()):
            if isinstance(b, QuantizedWeight) and b.scales.dtype == torch.int8:
                if id(b) not in memo:
                    mins = None if b.mins is None else reference.expand_kquant_scales(b.mins, negate=True)
                    memo[id(b)] = QuantizedWeight(b.qweight, reference.expand_kquant_scales(b.scales), mins, dtype=b.dtype, kind=b.kind)
                set_weight(mod, memo[id(b)], name)
    return model
ids = [(i * 7919) % 30000 + 10 for i in range(700)]
def measure(runner):
    with torch.inference_mode():
        cache = runner.new_cache(1, 800)
        s = time.perf_counter(); runner.prefill(cache, [ids]); pre = time.perf_counter() - s
        tok = torch.tensor([[11]]); ts = []
        for i in range(12):
            s = time.perf_counter(); runner.forward(cache, tok, [700]); ts.append(time.perf_counter() - s)
    return pre * 1000, statistics.median(ts) * 1000
kq = ModelRunner(m)
memo = {id(t): t for t in list(m.parameters()) + list(m.buffers())}
fl_model = float_scales(copy.deepcopy(m, memo))  # the modules copied, the weights shared, then swapped
print("joined groups", lay_out_projections(fl_model))
fl = ModelRunner(fl_model)
for r in (kq, fl): measure(r)
for _ in range(2):
    for name, r in (("kquant", kq), ("float", fl)):
        pre, dec = measure(r)
        print(ops.cpu_isa(), name, "prefill 700: %.0f ms, decode (700 cached): %.2f ms" % (pre, dec), flush=True)
