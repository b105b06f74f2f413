import torch, json
from specdec_kernels.models import load_model
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.models.quantized_weight import QuantizedWeight
lm = load_model(weights="float32"); m = lm.model
rows=[json.loads(l) for l in open('/work/main/specdec_kernels/data/prompts_dev.jsonl')]
ids = torch.tensor([lm.tokenizer(rows[3]['turns'][0])['input_ids'][:200]])
with torch.inference_mode():
    ref = m(ids).logits[0]
    for g in (32, 64):
        c = quantized_copy(m, 4, g)
        out = c(ids).logits[0]
        # dequantized reference: same copy with dense weights
        import copy
        d = quantized_copy(m, 4, g)
        n = 0
        for mod in d.modules():
            w = mod._parameters.get("weight") if hasattr(mod, "_parameters") else None
            for name, b in list(mod._buffers.items()) + list(mod._parameters.items()):
                if isinstance(b, QuantizedWeight):
                    dense = b.dequantize().float()
                    if name in mod._parameters: mod._parameters[name] = torch.nn.Parameter(dense, requires_grad=False)
                    else: mod._buffers[name] = dense
                    n += 1
        deq = d(ids).logits[0]
        agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
        agree_d = (deq.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(g, "kernel copy agrees with fp32 %.3f; dequantized-dense copy agrees %.3f (%d weights); kernel vs dense max|d| %.3f" % (agree, agree_d, n, (out - deq).abs().max().item()))
