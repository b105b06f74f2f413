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

