import sys
sys.path.insert(0, "/work/main")
from specdec_kernels.models.loading import load_model, encode_prompts
from specdec_kernels.bench.prompts import load_prompts, select_prompts
from specdec_kernels.decoding import generate, make_drafter
loaded = load_model(None, weights="float32")
model, tok = loaded.model, loaded.tokenizer
prompts = select_prompts(load_prompts(), per_category=1)
ids = encode_prompts(tok, [p.text for p in prompts])
outs = []
for rep in range(3):
    d = make_drafter("quantized-self")
    out = generate(model, [ids[0]], drafter=d, max_new_tokens=64, tokenizer=tok)
    outs.append(out.tokens[0])
    print(rep, out.stats.target_forwards, [round(c(t),4) for c in d._costs for t in (1,2,3,4)])
print("same output:", outs[0] == outs[1] == outs[2])
