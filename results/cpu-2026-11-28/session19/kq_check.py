import torch
from specdec_kernels import ops, reference
from specdec_kernels.models.quantized_weight import QuantizedWeight, KQuantScales, pack_panels
g = torch.Generator().manual_seed(0)
def make(n, k, bits, group):
    sub = torch.randint(-64 if bits == 8 else 0, 64, (n, k // group), generator=g).to(torch.int8)
    d = (torch.rand(n, k // 256, generator=g) * 1e-2).half()
    dr = d.float().repeat_interleave(256 // group, dim=1)
    scales = dr * sub.float()
    if bits == 4:
        q = torch.randint(0, 256, (n, k // 2), generator=g).to(torch.uint8)
        mn = torch.randint(0, 64, (n, k // group), generator=g).to(torch.int8)
        dmin = (torch.rand(n, k // 256, generator=g) * 1e-2).half()
        mins = -(dmin.float().repeat_interleave(256 // group, dim=1) * mn.float())
        kq = KQuantScales(sub, d, mn, dmin)
    else:
        q = torch.randint(-32, 32, (n, k), generator=g).to(torch.int8)
        mins, kq = None, KQuantScales(sub, d)
    plain = pack_panels(QuantizedWeight(q, scales, mins))
    compact = pack_panels(QuantizedWeight(q, scales, mins, kquant=kq))
    return plain, compact
for bits, group in ((4, 32), (8, 16), (8, 32)):
    for n, k in ((48, 512), (16, 256), (160, 1536)):
        plain, compact = make(n, k, bits, group)
        assert compact.scales.dtype == torch.int8, compact.scales.dtype
        assert torch.equal(compact.dequantize(), plain.dequantize())
        ids = torch.tensor([0, n - 1, 17 % n])
        assert torch.equal(torch.nn.functional.embedding(ids, compact), plain.dequantize()[ids])
        for isa in ("portable", "avx2", "avx512"):
            ops.cpu_isa(isa)
            for m in (1, 3, 9, 17):
                x = torch.randn(m, k, generator=g)
                a = ops.quantized_linear(x, plain.qweight, plain.scales, plain.mins)
                b = ops.quantized_linear(x, compact.qweight, compact.scales, compact.mins)
                assert torch.equal(a, b), (bits, group, n, k, isa, m, (a - b).abs().max())
        ops.cpu_isa("none")
        print("ok", bits, group, n, k, compact.scales.shape, compact.group, compact.nbytes_resident / plain.nbytes_resident)
