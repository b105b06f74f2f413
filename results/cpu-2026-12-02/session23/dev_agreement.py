# Offline agreement with the target on the dev prompts' own greedy answers (evaluation only:
# nothing trains on them): the first 4 prompts of each of the file's 13 categories, first turn,
# 128 new tokens, features recorded by the engine into DEVCACHE (made once). Prints, for each
# EAGLE drafter and Medusa head folder given, top-1 per unrolled step (EAGLE) or per head
# (Medusa) overall and by category, and on the held-out split of a training cache if given.
# usage: python3 dev_agreement.py [--data CACHE] [--eagle DIR ...] [--medusa DIR ...]
import argparse
from pathlib import Path

from specdec_kernels.data import load_prompts
from specdec_kernels.eagle.model import load_eagle
from specdec_kernels.medusa.heads import load_heads
from specdec_kernels.models import load_model
from specdec_kernels.training.eagle import evaluate
from specdec_kernels.training.medusa import build_examples, evaluate_heads, split_records
from specdec_kernels.training.selfdistill import DataCache, generate_chunk

p = argparse.ArgumentParser()
p.add_argument("--devcache", default="/tmp/devfeat/cache4")
p.add_argument("--data")
p.add_argument("--eagle", nargs="*", default=[])
p.add_argument("--medusa", nargs="*", default=[])
p.add_argument("--steps", type=int, default=3)
a = p.parse_args()
loaded = load_model("default")
target = loaded.model
out = Path(a.devcache)
by = {}
for r in load_prompts():
    by.setdefault(r["category"], []).append(r["turns"][0])
cats = sorted(by)
if not (out / "chunk_0000.safetensors").exists():
    prompts = [q for c in cats for q in by[c][:4]]
    out.mkdir(parents=True, exist_ok=True)
    generate_chunk(loaded, prompts, out / "chunk_0000.safetensors",
                   layers=(2, 15, 27, "final_norm"), max_new_tokens=128, sampled_fraction=0.0)
dev = DataCache.load(out)
big = DataCache.load(a.data) if a.data else None
hidden = int(target.config.hidden_size)
lm = target.get_output_embeddings()
args = argparse.Namespace(steps=a.steps, tokens_per_batch=4096, max_len=768, bf16=True, decay=0.8)
for path in a.eagle:
    draft = load_eagle(path, target.config.num_hidden_layers)
    draft.bind_target(target)
    teacher = lm.weight.detach()[draft.draft_ids].float()
    line = f"eagle {path}: dev {evaluate(draft, dev, list(range(dev.num_sequences)), args, teacher, hidden)}"
    if big is not None:
        _, test = big.split(0.05, 0)
        line += f" held-out {evaluate(draft, big, test, args, teacher, hidden)}"
    print(line)
    per = [f"{c} {evaluate(draft, dev, list(range(4 * i, 4 * i + 4)), args, teacher, hidden)[0]:.2f}"
           for i, c in enumerate(cats)]
    print("  step-1 by category: " + ", ".join(per), flush=True)
records = dev.medusa_records()
for path in a.medusa:
    heads = load_heads(path)
    acc = evaluate_heads(heads, build_examples(records, 4), lm_head=lm, top=5)
    line = f"medusa {path}: dev top-1 {[round(x[0], 3) for x in acc]}"
    if big is not None:
        _, held = split_records(big.medusa_records(), 0.1, 0)
        ho = evaluate_heads(heads, build_examples(held, 4), lm_head=lm, top=1)
        line += f" held-out {[round(x[0], 3) for x in ho]}"
    print(line)
    per = []
    for i, c in enumerate(cats):
        x = evaluate_heads(heads, build_examples(records[4 * i: 4 * i + 4], 4), lm_head=lm, top=1)
        per.append(f"{c} {x[0][0]:.2f}")
    print("  head-0 top-1 by category: " + ", ".join(per), flush=True)
