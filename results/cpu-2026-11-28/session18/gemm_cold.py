import torch, time
from specdec_kernels import ops
from specdec_kernels.models import load_model
from specdec_kernels.decoding.cpu_matmul import gemm_linear
m = load_model(weights="float32").model
ws = [mod.weight.detach() for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and "lm_head" not in n]
print(len(ws))
for rows in (128, 659):
    xs = {k: torch.randn(1, rows, k) for k in (576, 1536)}
    for name, f in (("package", ops.small_batch_linear), ("onednn", gemm_linear), ("package", ops.small_batch_linear), ("onednn", gemm_linear)):
        for w in ws: f(xs[w.shape[1]], w, None)
        t = time.perf_counter()
        for w in ws: f(xs[w.shape[1]], w, None)
        dt = time.perf_counter() - t
        fl = sum(2 * rows * w.numel() for w in ws) / 1e9
        print(rows, name, "%.1f ms, %.0f GFLOPS" % (dt * 1e3, fl / dt))
