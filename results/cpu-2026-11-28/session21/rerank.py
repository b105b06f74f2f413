import json, torch
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model, encode_prompts
from specdec_kernels.models.quantized_weight import quantize_weight
from specdec_kernels.training.prompts import first_stage_prompts, task_prompts
from specdec_kernels import generate
loaded = load_model(weights="float32")
target = loaded.model
copy8 = quantized_copy(target, 4, 32, head_bits=8)
E = target.get_output_embeddings().weight.detach()
W4 = quantize_weight(E, 4, 32); W8 = copy8.get_output_embeddings().weight
tok = loaded.tokenizer
texts = first_stage_prompts(6, seed=311)
ids = encode_prompts(tok, texts)
seqs = [o for o in generate(loaded, ids, max_new_tokens=128).tokens]
rt, rc = ModelRunner(target), ModelRunner(copy8)
stats = {"int8": 0, "dense": 0, "int4": 0, **{f"rerank{k}": 0 for k in (2, 4, 8, 16)}}
n = 0
with torch.inference_mode():
    for p, o in zip(ids, seqs):
        full = p + o
        ct = rt.new_cache(1, len(full) + 1); lt = rt.append(ct, [full], want_logits=True) if False else None
        logits_t = rt.forward(ct, torch.tensor([full]), [0], prefill=False)[0]
        cc = rc.new_cache(1, len(full) + 1)
        logits8, feats = rc.forward(cc, torch.tensor([full]), [0], features=True)
        x = feats[0]; want = logits_t.argmax(-1)[len(p) - 1:-1]; x = x[len(p) - 1:-1]
        d = x @ E.T; l4 = W4.linear(x[None])[0]; l8 = W8.linear(x[None])[0]
        n += len(want)
        stats["int8"] += (l8.argmax(-1) == want).sum().item()
        stats["dense"] += (d.argmax(-1) == want).sum().item()
        stats["int4"] += (l4.argmax(-1) == want).sum().item()
        for k in (2, 4, 8, 16):
            top = l4.topk(k, -1).indices
            fine = (x[:, None, :] * E[top]).sum(-1)
            pick = top.gather(1, fine.argmax(-1, keepdim=True))[:, 0]
            stats[f"rerank{k}"] += (pick == want).sum().item()
print(n, {k: round(v / n, 4) for k, v in stats.items()})
