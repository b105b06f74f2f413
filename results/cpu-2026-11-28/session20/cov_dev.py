"""Evaluation only: coverage of the dev answers (from the main job's outputs) by the ranking."""
import json
from specdec_kernels.models import load_default_model, encode_prompts
d = json.load(open("results/cpu-2026-11-28/session19/mainjob-avx512/results.json"))
ranking = json.load(open("specdec_kernels/data/draft_vocab/smollm2-135m-instruct.json"))["ranked"]
seen = set(ranking); order = ranking + [t for t in range(49152) if t not in seen]
rows = [m for m in d["measurements"] if m["method"] == "ours-autoregressive"]
dev = [json.loads(l) for l in open("specdec_kernels/data/prompts_dev.jsonl")]
byid = {str(p.get("question_id")): p for p in dev}
loaded = load_default_model()
tok = loaded.tokenizer
cats = {}
for m in rows:
    qid = m["question_ids"][0]
    p = byid[str(qid)]
    text = p.get("turns", [p.get("prompt")])[0] if "turns" in p else p.get("prompt") or p.get("text")
    prompt = encode_prompts(tok, [text])[0]
    ans = m["tokens"][0]
    cats.setdefault(m["category"], []).append((prompt, ans))
for n in (8192, 16384, 24576):
    ids = set(order[:n]); line = [str(n)]
    T = C = X = 0
    for c, lst in cats.items():
        t = sum(len(a) for _, a in lst); cov = sum(x in ids for _, a in lst for x in a)
        ctx = 0
        for p, a in lst:
            s = set(p)
            for x in a: ctx += x in ids or x in s; s.add(x)
        T += t; C += cov; X += ctx
        line.append(f"{c}:{cov/t:.3f}/{ctx/t:.3f}")
    line.append(f"all:{C/T:.3f}/{X/T:.3f}")
    print("  ".join(line))
