import sys, time, torch, statistics
sys.path.insert(0, '/work/main')
torch.set_num_threads(2)
from specdec_kernels.decoding.quantized import quantized_copy
import specdec_kernels.decoding.runner as rm
from specdec_kernels.models import load_model
from specdec_kernels import ops
import specdec_kernels.models.direct_forward as dfm
loaded = load_model(weights="float32")
q = quantized_copy(loaded.model, bits=4, group=32, head_bits=4, rerank=4)
r = rm.ModelRunner(q); narrow = r.narrow_kv_dtype()
acc = {}
def wrap(name, fn):
    def w(*a, **k):
        t = time.perf_counter(); out = fn(*a, **k); acc[name] = acc.get(name, 0) + time.perf_counter() - t; return out
    return w
for n in ['block_forward_kwargs', 'chain_parents', 'cache_kwargs', 'kernel_linear']:
    if hasattr(rm, n): setattr(rm, n, wrap(n, getattr(rm, n)))
DF = dfm.DirectForward
for n in ['stack_arguments', 'hooked', 'covers', 'stacked', '_logits']:
    setattr(DF, n, wrap(n, getattr(DF, n)))
dfm.ops.decoder_stack_ = wrap('decoder_stack_', ops.decoder_stack_)
for n in ['plan_write', 'planned_block']:
    setattr(rm.KVCache, n, wrap(n, getattr(rm.KVCache, n)))
rm.ModelRunner._forward_direct = wrap('_forward_direct', rm.ModelRunner._forward_direct)
rm.ModelRunner._use_cpu_kernels = wrap('_use_cpu_kernels', rm.ModelRunner._use_cpu_kernels)
with torch.inference_mode():
    cache = r.new_cache(1, 256 + 400, narrow)
    r.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(256)]])
    tokens = torch.tensor([[11]])
    for i in range(20): r.forward(cache, tokens, [256])
    N = 100
    acc.clear()
    s = time.perf_counter()
    for i in range(N): r.forward(cache, tokens, [256])
    total = time.perf_counter() - s
    print('total', round(total / N * 1e3, 3))
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"  {k:22s} {v / N * 1e3:.3f} ms")
