import torch
from specdec_kernels.models import load_model
from specdec_kernels.medusa.heads import MedusaHeads
for weights in ("file", "float32"):
    m = load_model("default", weights=weights).model
    lm = m.get_output_embeddings()
    for p in m.parameters(): p.requires_grad_(False)
    V = lm.weight.shape[0]
    h = MedusaHeads(576, V, 2, 1, draft_ids=torch.arange(0, 4096 * 8, 8))
    h.init_projections_from(lm.weight.detach().float())
    x = torch.randn(5, 576)
    out = h(x, lm)
    out.float().logsumexp(-1).sum().backward()
    g = [p.grad for p in h.parameters() if p.requires_grad]
    print(weights, type(lm.weight).__name__, [None if t is None else float(t.abs().sum()) for t in g])
