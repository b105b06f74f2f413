import torch, json, copy
from specdec_kernels.models import load_model
from specdec_kernels.models.quantized_weight import quantize_weight, quantize_model, set_weight
lm = load_model(weights="float32"); m = lm.model
rows=[json.loads(l) for l in open('/work/main/specdec_kernels/data/prompts_dev.jsonl')]
texts = [rows[i]['turns'][0] for i in (3, 50, 100, 150, 200)]
def copy_with(head_bits):
    memo = {id(t): t for t in list(m.parameters()) + list(m.buffers())}
    c = copy.deepcopy(m, memo)
    head = c.get_output_embeddings()
    if head_bits is None:  # dense head: untie by a separate module weight
        head.weight = torch.nn.Parameter(m.get_output_embeddings().weight.detach().clone(), requires_grad=False)
        head.__class__ = type("DenseHead", (torch.nn.Module,), {"forward": lambda self, x: torch.nn.functional.linear(x, self.weight)})
    elif head_bits == 8:
        set_weight(head, quantize_weight(head.weight, 8, 32))
        head.__class__ = type("Int8Head", (torch.nn.Linear,), {})
    quantize_model(c, 4, 32)
    return c.eval()
with torch.inference_mode():
    for hb in (4, 8, None):
        c = copy_with(hb)
        agree = []
        for t in texts:
            ids = torch.tensor([lm.tokenizer(t)['input_ids'][:300]])
            agree.append((c(ids).logits[0].argmax(-1) == m(ids).logits[0].argmax(-1)).float().mean().item())
        print("head", hb, "agreement %.3f" % (sum(agree) / len(agree)), type(c.get_output_embeddings().weight).__name__)
