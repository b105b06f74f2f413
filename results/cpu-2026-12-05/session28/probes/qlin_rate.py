import torch, time, sys
from specdec_kernels import ops
from python_tests.test_quantized_panels import panel_operands
torch.set_num_threads(2)
gen = torch.Generator().manual_seed(0)
for bits, group, n, k in [(4, 32, 1536, 576), (4, 32, 49152, 576), (8, 32, 1536, 576), (8, 16, 576, 1536)]:
    res = []
    for m in [1, 2, 3, 4, 6, 8, 12, 16, 32]:
        x, _, panels, _ = panel_operands(m, n, k, gen, bits=bits, group=group, mins=(bits == 4))
        for _ in range(10): ops.quantized_linear(x, *panels)
        reps = 50 if n > 10000 else 400
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps): ops.quantized_linear(x, *panels)
            ts.append((time.perf_counter() - t) / reps)
        res.append(f"M={m}:{min(ts)*1e6:.0f}")
    print(f"int{bits} g{group} {n}x{k}", " ".join(res))
