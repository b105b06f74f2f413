import torch, time, sys
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from torch.profiler import profile, ProfilerActivity
target = load_model(weights="float32").model
m = quantized_copy(target, bits=4, group=32, head_bits=int(sys.argv[1]) if len(sys.argv)>1 else 8)
r = ModelRunner(m)
prefix=256
with torch.inference_mode():
    cache = r.new_cache(1, prefix + 300)
    r.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    tok = torch.tensor([[11]])
    for _ in range(20): r.forward(cache, tok, [prefix])
    print("path", r.forward_path)
    ts=[]
    for _ in range(50):
        s=time.perf_counter(); r.forward(cache, tok, [prefix]); ts.append(time.perf_counter()-s)
    ts.sort(); print("median ms", 1000*ts[25])
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(20): r.forward(cache, tok, [prefix])
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
