import json, time, torch, statistics, sys
from specdec_kernels import generate
from specdec_kernels.models import load_model
target = load_model(weights="float32")
rows=[json.loads(l) for l in open('/work/main/specdec_kernels/data/prompts_dev.jsonl')]
ps = [[r for r in rows if r['category']==c][0]['turns'][0] for c in ('rag', 'summarization', 'math_reasoning')]
generate(target, [ps[2]], max_new_tokens=1)
res = []
for p in ps:
    t = [generate(target, [p], max_new_tokens=1).stats.prefill_seconds for _ in range(5)]
    res.append("%.3f" % statistics.median(t))
out = generate(target, [ps[0]], max_new_tokens=1)
print(__import__("specdec_kernels").__file__.split("/specdec_kernels")[0], "prefill s (rag, summ, math):", res, out.stats.kernels.get("prefill_gemm_rows"), flush=True)
