import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from bench.bench_verify import chain_case
from specdec_kernels import ops
from specdec_kernels.sampling import SamplingParams
for isa in ["avx512_bf16", "avx2"]:
    ops.cpu_isa(isa)
    for vocab in [49152, 151936]:
        drafts, logits, probs = chain_case(1, 4, vocab, "cpu")
        for mode, kw in [("sampling", dict(temperature=0.8)), ("greedy", dict(temperature=0.0)), ("topkp", dict(temperature=0.8, top_k=50, top_p=0.9))]:
            p = SamplingParams.create(1, seed=7, **kw)
            res = {}
            for rep in range(3):
                for th in [1, 2]:
                    torch.set_num_threads(th)
                    f = lambda: ops.verify_chain(drafts, None, logits, probs, p)
                    f(); ts = []
                    for _ in range(50):
                        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
                    res.setdefault(th, []).append(statistics.median(ts) * 1e6)
            torch.set_num_threads(2)
            print(isa, vocab, mode, {k: round(statistics.median(v), 1) for k, v in res.items()})
