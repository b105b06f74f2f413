# Offline: Medusa heads' top-1 on the dev prompts' own greedy answers (features recorded by the
# same engine), against the held-out figure on the training distribution.
import sys, torch
from pathlib import Path
from specdec_kernels.models import load_model
from specdec_kernels.data import load_prompts
from specdec_kernels.training.selfdistill import generate_chunk, DataCache
from specdec_kernels.training.medusa import build_examples, evaluate_heads
from specdec_kernels.medusa.heads import load_heads
from specdec_kernels.decoding.medusa import default_heads_path
out = Path("/tmp/devfeat/cache")
loaded = load_model("default")
if not (out / "chunk_0000.safetensors").exists():
    rows = load_prompts()
    by = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r["turns"][0])
    prompts = [p for c in sorted(by) for p in by[c][:4]]
    out.mkdir(parents=True, exist_ok=True)
    generate_chunk(loaded, prompts, out / "chunk_0000.safetensors", layers=("final_norm",),
                   max_new_tokens=128, sampled_fraction=0.0)
records = DataCache.load(out).medusa_records()
ex = build_examples(records, 4)
lm = loaded.model.get_output_embeddings()
for name, path in (("shipped", default_heads_path()), ("new-4ep", "/work/i24/medusa-out"), ("new-6ep", "/work/i24/medusa-out6")):
    heads = load_heads(path)
    acc = evaluate_heads(heads, ex, lm_head=lm, top=5)
    print(name, "top1", [round(a[0], 3) for a in acc], "top5", [round(sum(a), 3) for a in acc])
