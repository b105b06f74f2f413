import time, torch, ctypes, sys
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight, pack_panels
libc = ctypes.CDLL("libc.so.6", use_errno=True)
MADV_HUGEPAGE = 14
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = []
for _ in range(30):
    layers += [pack_panels(quantize_weight(torch.randn(*s), 4, 32)) for s in shapes]
def parts(q): return [q.qweight, q.scales] + ([q.mins] if q.mins is not None else [])
def arena(huge):
    total = sum(p.numel() * p.element_size() + 64 for q in layers for p in parts(q)) + (4 << 20)
    raw = torch.empty(total, dtype=torch.uint8)
    addr = raw.data_ptr()
    start = (addr + (2 << 20) - 1) & ~((2 << 20) - 1)
    off0 = start - addr
    if huge:
        r = libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(total - off0 - (2 << 20)), MADV_HUGEPAGE)
        assert r == 0, ctypes.get_errno()
    off = off0
    out = []
    for q in layers:
        new = []
        for p in parts(q):
            n = p.numel() * p.element_size()
            v = raw[off:off + n].view(p.dtype).view(p.shape)
            v.copy_(p); new.append(v); off += (n + 63) // 64 * 64
        out.append(new + ([None] if len(new) == 2 else []))
    return raw, out
raw_h, huge = arena(True)
raw_s, small = arena(False)
sep = [[q.qweight, q.scales, q.mins] for q in layers]
print(open('/proc/self/smaps_rollup').read().split('AnonHugePages:')[1].split('\n')[0])
nbytes = sum(q.nbytes_resident for q in layers)
xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
def run(ws):
    t = time.perf_counter()
    for (w, s, m) in ws: ops.quantized_linear(xs[w.shape[1] * 32], w, s, m)
    return time.perf_counter() - t
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
res = {"separate": [], "arena 4K": [], "arena huge": []}
for _ in range(3): run(sep); run(small); run(huge)
for _ in range(25):
    res["separate"].append(run(sep)); res["arena 4K"].append(run(small)); res["arena huge"].append(run(huge))
for k, v in res.items():
    v.sort(); print(f"{k}: median {1000*v[12]:.2f} ms ({nbytes/v[12]/1e9:.1f} GB/s), q1 {1000*v[6]:.2f}")
