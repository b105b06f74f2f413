import torch, time, sys
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(2048, 2048); b = torch.randn(2048, 2048)
for _ in range(2): a @ b
t = time.perf_counter(); n = 5
for _ in range(n): a @ b
dt = (time.perf_counter() - t) / n
print(sys.argv[1], "threads", 2 * 2048**3 / dt / 1e9, "GFLOPS")
