import sys, hashlib
sys.path.insert(0, "/work/main")
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding import budget as B
log = []
orig_record = B.ChainBudget.record
def record(self, drafted, accepted):
    log.append(f"{accepted}/{drafted}")
    return orig_record(self, drafted, accepted)
B.ChainBudget.record = record
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=1)
ids = encode_prompts(tok, [p.text for p in prompts])
res = []
for rep in range(2):
    log.clear()
    d = make_drafter("quantized-self")
    out = generate(model, [ids[0]], drafter=d, max_new_tokens=64, tokenizer=tok)
    res.append(f"{out.stats.target_forwards}:{' '.join(log[12:16])}")
print("RUNS", res)
