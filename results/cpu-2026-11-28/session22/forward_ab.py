import sys, time, torch, statistics
root = sys.argv[1]
sys.path.insert(0, root)
torch.set_num_threads(2)
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
sys.path.insert(0, root)
from bench.quantized_cost import one_token_ms
loaded = load_model(weights="float32")
q = quantized_copy(loaded.model, bits=4, group=32, head_bits=4, rerank=4)
r = ModelRunner(q); t = ModelRunner(loaded.model)
with torch.inference_mode():
    one_token_ms(r, 256, 5, kv_dtype=r.narrow_kv_dtype()); one_token_ms(t, 256, 5)
    d = one_token_ms(r, 256, 60, kv_dtype=r.narrow_kv_dtype()); g = one_token_ms(t, 256, 30)
print(root, 'draft', round(statistics.median(d), 3), 'target', round(statistics.median(g), 3))
