import torch, time, statistics
from specdec_kernels.models import load_model
from specdec_kernels.decoding.runner import ModelRunner
m = load_model(weights="float32").model
rt = ModelRunner(m)
P = 256
ct = rt.new_cache(1, P + 200)
with torch.inference_mode():
    rt.prefill(ct, [list(range(10, 10 + P))])
    def tgt(M):
        rt.forward(ct, torch.full((1, M), 42), [P])
    def run(pattern, reps=8):
        ts = {}
        for r in range(reps):
            for M in pattern:
                t = time.perf_counter(); tgt(M); dt = time.perf_counter() - t
                if r >= 2: ts.setdefault(M, []).append(dt * 1e3)
        return {M: round(statistics.median(v), 2) for M, v in ts.items()}
    for rnd in range(2):
        print("only 1:", run([1]), " only 8:", run([8]), " 1,8:", run([1, 8]), " 1,2,4,8,16,32,64,128:", run([1, 2, 4, 8, 16, 32, 64, 128], 5), flush=True)
