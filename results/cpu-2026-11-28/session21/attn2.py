import time, torch, sys
from specdec_kernels import ops
torch.manual_seed(0)
DT = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
def us(call, n):
    for _ in range(5): call()
    t = time.perf_counter()
    for _ in range(n): call()
    return (time.perf_counter() - t) / n * 1e6
for batch in (1, 2):
  for threads in (1, 2):
    torch.set_num_threads(threads)
    for prefix in (1024, 2048, 8192):
        caches = [(torch.randn(batch, 3, prefix + 1, 64).to(DT), torch.randn(batch, 3, prefix + 1, 64).to(DT)) for _ in range(8)]
        q = torch.randn(batch, 1, 9, 64); lens = torch.tensor([prefix] * batch)
        mask = ops.build_tree_masks(torch.tensor([[-1]] * batch), lens).packed_mask
        i = [0]
        def call():
            k, v = caches[i[0] % 8]; i[0] += 1
            ops.tree_attention(q, k, v, lens, mask, 0.125)
        t = us(call, 100)
        print("batch", batch, "threads", threads, "prefix", prefix, "%.1f us" % t, "%.1f GB/s" % (2 * caches[0][0].nbytes / t / 1e3))
