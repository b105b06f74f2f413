import sys
sys.path.insert(0, "/work/main")
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=1)
ids = encode_prompts(tok, [p.text for p in prompts])
d = make_drafter("quantized-self")
for p, x in zip(prompts, ids):
    out = generate(model, [x], drafter=d, max_new_tokens=64, tokenizer=tok)
    print(p.category, out.stats.requests[0].tau, out.stats.drafter_report)
print([ (t, d._costs[0](t), d._costs[1](t)) for t in (1,2,3,4)])
