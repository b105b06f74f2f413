"""verify_chain against one amax pass over the same logits, both ISA paths alternated in one
process (ops.cpu_isa caps ours; torch's amax keeps its own ISA). Medians of N calls."""
import json, sys, time, statistics
import os, torch
import os; sys.path.insert(0, os.environ.get("PKG", "/work/main"))
from bench.bench_verify import chain_case, SAMPLING
from specdec_kernels import ops
from specdec_kernels.sampling import SamplingParams

MODES = {"greedy": dict(temperature=0.0), "sampling": dict(temperature=0.8), "top-k+top-p": SAMPLING}
SHAPES = [(1, 4, 151936), (32, 8, 151936), (1, 4, 49152)]
ISAS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["avx512_bf16", "avx2"]
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3

def med(fn, n):
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

out = {}
for batch, k, vocab in SHAPES:
    drafts, logits, probs = chain_case(batch, k, vocab, "cpu")
    n = 40 if batch == 1 else 6
    for r in range(ROUNDS):
        for isa in ISAS:
            ops.cpu_isa(isa)
            a = med(lambda: logits.amax(-1), n)
            out.setdefault((batch, k, vocab, isa, "amax"), []).append(a)
            for mode, kw in MODES.items():
                p = SamplingParams.create(batch, seed=7, device="cpu", **kw)
                t = med(lambda: ops.verify_chain(drafts, None, logits, probs, p), n)
                out.setdefault((batch, k, vocab, isa, mode), []).append(t / a)
for key, v in out.items():
    b, k, V, isa, mode = key
    if mode == "amax":
        print(f"B={b} K={k} V={V} {isa:12s} amax {statistics.median(v)*1e6:8.1f} us")
    else:
        print(f"B={b} K={k} V={V} {isa:12s} {mode:12s} {statistics.median(v):5.2f}x  (rounds {', '.join(f'{x:.2f}' for x in v)})")
