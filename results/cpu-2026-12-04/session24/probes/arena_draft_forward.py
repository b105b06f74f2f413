import time, torch, ctypes, sys, statistics
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from specdec_kernels.models.quantized_weight import QuantizedWeight
libc = ctypes.CDLL("libc.so.6", use_errno=True)

def relocate(model, huge=True):
    tensors = []
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, QuantizedWeight):
            tensors += [t for t in (w.qweight, w.scales, w.mins) if t is not None]
    # unique storages in first-use order
    order, seen = [], {}
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen[key] = t.untyped_storage(); order.append(key)
    total = sum((seen[k].nbytes() + 63) // 64 * 64 for k in order) + (4 << 20)
    raw = torch.empty(total, dtype=torch.uint8)
    addr = raw.data_ptr(); start = (addr + (2 << 20) - 1) & ~((2 << 20) - 1); base = start - addr
    if huge:
        assert libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(total - base - (2 << 20)), 14) == 0
    where, off = {}, base
    for k in order:
        n = seen[k].nbytes()
        raw[off:off + n].copy_(torch.frombuffer(bytearray(0), dtype=torch.uint8) if n == 0 else torch.tensor([], dtype=torch.uint8).set_(seen[k]))
        where[k] = off; off += (n + 63) // 64 * 64
    print("total", total >> 20, "MB; AHP after copy", open("/proc/self/smaps_rollup").read().split("AnonHugePages:")[1].split("\n")[0].strip())
    storage = raw.untyped_storage()
    done = set()
    for t in tensors:
        if id(t) in done: continue
        done.add(id(t))
        k = t.untyped_storage().data_ptr()
        es = t.element_size()
        t.set_(storage, where[k] // es + t.storage_offset(), t.size(), t.stride())
    return raw

target = load_model(weights="float32").model
a = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4)
import specdec_kernels.decoding.quantized as qmod
qmod._COPIES.clear() if hasattr(qmod, "_COPIES") else None
b = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=5)  # a distinct copy object
b_raw = relocate(b, huge=True)
print(open('/proc/self/smaps_rollup').read().split('AnonHugePages:')[1].split('\n')[0].strip())
prefix = 256
def runner_time(runner, steps=30):
    cache = runner.new_cache(1, prefix + steps + 8, runner.narrow_kv_dtype())
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    token = torch.tensor([[11]])
    for _ in range(2):
        runner.forward(cache, token, list(cache.host_lens)); cache.extend([1])
    ts = []
    for _ in range(steps - 4):
        t = time.perf_counter(); runner.forward(cache, token, list(cache.host_lens)); cache.extend([1]); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000
ra, rb = ModelRunner(a), ModelRunner(b)
with torch.inference_mode():
    # same results?
    res = {"separate": [], "arena huge": []}
    for r in range(int(__import__("os").environ.get("ROUNDS", "8"))):
        res["separate"].append(runner_time(ra)); res["arena huge"].append(runner_time(rb))
for k, v in res.items(): print(k, [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
