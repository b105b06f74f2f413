"""The float32 target's one-token forward (prefix 256) is ~13-15 or ~17-19 ms depending on the
process. Per process: the forward as loaded, then after every weight is copied into fresh
memory (torch's allocator; THP_MEM_ALLOC_ENABLE=1 in the environment asks it for huge pages),
with the share of the process's anonymous memory on huge pages."""
import re, statistics, time
import torch
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model


def forward_ms(runner, cache):
    t = []
    for _ in range(40):
        s = time.perf_counter(); runner.forward(cache, torch.tensor([[11]]), [256])
        t.append(1000 * (time.perf_counter() - s))
    return statistics.median(t[5:])


def huge_mb():
    text = open("/proc/self/smaps_rollup").read()
    return int(re.search(r"AnonHugePages:\s+(\d+)", text).group(1)) // 1024


model = load_model(weights="float32").model
runner = ModelRunner(model)
with torch.inference_mode():
    cache = runner.new_cache(1, 300)
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(256)]])
    before = forward_ms(runner, cache)
    huge_before = huge_mb()
    for p in model.parameters():
        p.data = p.data.clone()
    runner = ModelRunner(model)
    after = forward_ms(runner, cache)
print(f"as loaded {before:.2f} ms ({huge_before} MB huge) | weights copied {after:.2f} ms "
      f"({huge_mb()} MB huge)")
