import json, sys
from specdec_kernels.decoding.draft_vocabulary import token_ranking
from specdec_kernels.models import load_model
tok = load_model("default").tokenizer if False else None
import transformers
ranking = json.load(open("specdec_kernels/data/draft_vocab/smollm2-135m-instruct.json"))["ranked"]
seen = set(ranking); order = ranking + [t for t in range(49152) if t not in seen]
for f in ("/tmp/s20/answers.json", "/tmp/s20/freq_answers.json"):
    rows = json.load(open(f))
    for stage in sorted(set(r[2] for r in rows)) + [None]:
        sel = [r for r in rows if stage is None or r[2] == stage]
        tot = sum(len(a) for _, a, _ in sel)
        line = [f"{f[-18:]} {stage or 'all':8s} {tot:6d}"]
        for n in (2048, 4096, 8192, 16384):
            ids = set(order[:n])
            cov = sum(t in ids for _, a, _ in sel for t in a) / tot
            ctx = 0
            for p, a, _ in sel:
                s = set(p)
                for t in a: ctx += t in ids or t in s; s.add(t)
            line.append(f"{n}:{cov:.3f}/{ctx/tot:.3f}")
        print("  ".join(line))
