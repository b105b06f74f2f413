import sys
sys.path.insert(0, "/work/main")
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding import budget as B
log = []
orig_record, orig_length = B.ChainBudget.record, B.ChainBudget.length
def record(self, drafted, accepted):
    log.append(f"{accepted}/{drafted}")
    return orig_record(self, drafted, accepted)
def length(self, cap):
    k = orig_length(self, cap)
    if k == 0: log.append("-")
    return k
B.ChainBudget.record, B.ChainBudget.length = record, length
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=1)
ids = encode_prompts(tok, [p.text for p in prompts])
for budget in (True, False):
    d = make_drafter("quantized-self", budget=budget)
    for p, x in zip(prompts, ids):
        log.clear()
        out = generate(model, [x], drafter=d, max_new_tokens=64, tokenizer=tok)
        acc = [l for l in log]
        print(budget, p.category[:8], f"tau {out.stats.requests[0].tau:.2f}", " ".join(acc))
