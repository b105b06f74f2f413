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
for rep in range(3):
    d = make_drafter("quantized-self")
    log.clear()
    out = generate(model, [ids[0]], drafter=d, max_new_tokens=64, tokenizer=tok)
    print(rep, " ".join(log), d._costs if hasattr(d, "_costs") else "")
