import sys, time, torch, statistics
sys.path.insert(0, '/work/main')
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from bench.quantized_cost import one_token_ms
loaded = load_model(weights="float32")
q = quantized_copy(loaded.model, bits=4, group=32, head_bits=4, rerank=4)
r = ModelRunner(q); t = ModelRunner(loaded.model)
with torch.inference_mode():
    for rnd in range(3):
        for n in (1, 2):
            torch.set_num_threads(n)
            d = one_token_ms(r, 256, 40, kv_dtype=r.narrow_kv_dtype())
            print('threads', n, 'draft', round(statistics.median(d), 3))
