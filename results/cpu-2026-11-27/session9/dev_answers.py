# Offline agreement with the target, per category, on the dev prompts' own greedy answers (first
# turn, the first 4 prompts of each of the file's 13 categories, 128 new tokens, features recorded
# by the engine; evaluation only, cache made by session8/dev_answers_eagle.py at /tmp/devfeat/cache4),
# and on the held-out split of the training cache.
# usage: python3 dev_answers.py MEDUSA_OLD MEDUSA_NEW EAGLE_OLD EAGLE_NEW
import argparse, sys
from specdec_kernels.models import load_model
from specdec_kernels.data import load_prompts
from specdec_kernels.training.selfdistill import DataCache
from specdec_kernels.training.medusa import build_examples, evaluate_heads, split_records
from specdec_kernels.training.eagle import evaluate
from specdec_kernels.medusa.heads import load_heads
from specdec_kernels.eagle.model import load_eagle

medusa_old, medusa_new, eagle_old, eagle_new = sys.argv[1:5]
cats = sorted({r["category"] for r in load_prompts()})
dev = DataCache.load("/tmp/devfeat/cache4")
big = DataCache.load("/work/i24/data")
_, test = big.split(0.05, 0)
target = load_model("default").model
lm = target.get_output_embeddings()
records = dev.medusa_records()
_, held_out = split_records(big.medusa_records(), 0.1, 0)  # specdec train medusa's split
held_out = build_examples(held_out, 4)
for name, path in (("medusa old", medusa_old), ("medusa new", medusa_new)):
    heads = load_heads(path)
    acc = evaluate_heads(heads, build_examples(records, 4), lm_head=lm, top=5)
    ho = evaluate_heads(heads, held_out, lm_head=lm, top=1)
    print(f"{name}: dev top-1 {[round(a[0], 3) for a in acc]} held-out(new cache) "
          f"{[round(a[0], 3) for a in ho]}")
    per = []
    for i, c in enumerate(cats):
        a = evaluate_heads(heads, build_examples(records[4 * i: 4 * i + 4], 4), lm_head=lm, top=1)
        per.append(f"{c} {a[0][0]:.2f}")
    print(f"{name}: dev head-0 top-1 by category: " + ", ".join(per), flush=True)
args = argparse.Namespace(steps=3, tokens_per_batch=4096, max_len=768, bf16=True, decay=0.8)
hidden = int(target.config.hidden_size)
for name, path in (("eagle old", eagle_old), ("eagle new", eagle_new)):
    draft = load_eagle(path, target.config.num_hidden_layers)
    draft.bind_target(target)
    teacher = target.get_output_embeddings().weight.detach()[draft.draft_ids].float()
    print(f"{name}: dev {evaluate(draft, dev, list(range(dev.num_sequences)), args, teacher, hidden)}"
          f" held-out(new cache) {evaluate(draft, big, test, args, teacher, hidden)}")
    per = [f"{c} {evaluate(draft, dev, list(range(4 * i, 4 * i + 4)), args, teacher, hidden)[0]:.2f}"
           for i, c in enumerate(cats)]
    print(f"{name}: dev step-1 top-1 by category: " + ", ".join(per), flush=True)
