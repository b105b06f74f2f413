import time, torch
from torch.profiler import profile, ProfilerActivity
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
m = load_model("/tmp/s19/qwen15b-shape.gguf", weights="file").model
r = ModelRunner(m)
mods = {}
for name, mod in m.named_modules():
    w = getattr(mod, "weight", None)
    if hasattr(mod, "out_features") and name.endswith(("q_proj","down_proj","lm_head","v_proj","gate_up_proj","gate_proj")):
        mods[name.split(".")[-1]] = mod
for k, mod in list(mods.items())[:8]:
    print(k, type(mod).__name__, getattr(mod.weight, "kind", None) if not callable(mod.weight) else [ (n, b.dtype, tuple(b.shape)) for n,b in mod.named_buffers()][:3])
prefix = 256
with torch.inference_mode():
    cache = r.new_cache(1, prefix + 100)
    r.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    tok = torch.tensor([[11]])
    for _ in range(5): r.forward(cache, tok, [prefix])
    ts = []
    for _ in range(20):
        s = time.perf_counter(); r.forward(cache, tok, [prefix]); ts.append(time.perf_counter() - s)
    print("path", r.forward_path, "median ms", 1000 * sorted(ts)[10])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(5): r.forward(cache, tok, [prefix])
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=20))
