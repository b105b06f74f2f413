import torch, time, sys, os
from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import quantize_weight, pack_panels
torch.manual_seed(0)
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}
M = int(sys.argv[1]) if len(sys.argv) > 1 else 1
print("isa", ops.cpu_isa(), "vnni env", os.environ.get("SPECDEC_CPU_VNNI"), "M", M)
for bits in (4, 8):
    tot = 0
    for name, (n, k) in shapes.items():
        copies = 2 if name == "head" else 40
        ws = [pack_panels(quantize_weight(torch.randn(n, k) * 0.02, bits, 32)) for _ in range(copies)]
        x = torch.randn(M, k)
        def call(w): return ops.quantized_linear(x, w.qweight, w.scales, w.mins)
        for w in ws: call(w)
        best = 1e9
        for _ in range(7):
            s = time.perf_counter()
            for w in ws: call(w)
            best = min(best, (time.perf_counter() - s) / copies)
        nbytes = ws[0].qweight.numel() + 2 * ws[0].scales.numel() * (2 if ws[0].mins is not None else 1)
        mult = 1 if name == "head" else 30
        tot += best * mult
        print(f"int{bits} {name:8s} {1e6*best:8.1f} us  {nbytes/best/1e9:6.1f} GB/s  x{mult} = {1e3*best*mult:.3f} ms")
    print(f"int{bits} total {1e3*tot:.3f} ms")
