import torch, collections
from specdec_kernels.models import load_model
from specdec_kernels.models.quantized_weight import QuantizedWeight, resident_bytes
m = load_model("/tmp/s19/qwen15b-shape.gguf", weights="file").model
agg = collections.defaultdict(lambda: [0, 0, 0])
seen = set()
for n, b in m.named_buffers():
    if isinstance(b, QuantizedWeight) and id(b) not in seen:
        seen.add(id(b))
        k = (b.kind, str(b.scales.dtype))
        agg[k][0] += b.shape[0] * b.shape[1]; agg[k][1] += b.nbytes_resident; agg[k][2] += 1
for k, (vals, by, cnt) in agg.items():
    print(k, cnt, "values %.0fM" % (vals / 1e6), "bytes %.0f MB" % (by / 1e6), "bits/value %.2f" % (8 * by / vals))
print("resident MB", resident_bytes(m) / 1e6)
