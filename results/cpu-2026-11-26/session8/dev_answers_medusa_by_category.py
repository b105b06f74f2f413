# Medusa head-0 top-1 per category on the dev answers (records in sorted-category order, 4 each).
import torch
from specdec_kernels.models import load_model
from specdec_kernels.data import load_prompts
from specdec_kernels.training.selfdistill import DataCache
from specdec_kernels.training.medusa import build_examples, evaluate_heads
from specdec_kernels.medusa.heads import load_heads
from specdec_kernels.decoding.medusa import default_heads_path
cats = sorted({r["category"] for r in load_prompts()})
records = DataCache.load("/tmp/devfeat/cache").medusa_records()
lm = load_model("default").model.get_output_embeddings()
heads = load_heads(default_heads_path())
for i, c in enumerate(cats):
    ex = build_examples(records[4 * i: 4 * i + 4], 4)
    acc = evaluate_heads(heads, ex, lm_head=lm, top=5)
    print(f"{c}: head-0 top-1 {acc[0][0]:.3f} top-5 {sum(acc[0]):.3f} rows {len(ex['targets'])}")
