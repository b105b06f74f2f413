# Offline: the shipped EAGLE drafter's top-1 per unrolled step on the dev prompts' own greedy
# answers, against the same on the held-out split of the training cache.
import argparse, torch
from pathlib import Path
from specdec_kernels.models import load_model
from specdec_kernels.data import load_prompts
from specdec_kernels.training.selfdistill import generate_chunk, DataCache
from specdec_kernels.training.eagle import evaluate
from specdec_kernels.eagle.model import load_eagle
from specdec_kernels.decoding.eagle import default_eagle_path
out = Path("/tmp/devfeat/cache4")
loaded = load_model("default")
target = loaded.model
if not (out / "chunk_0000.safetensors").exists():
    by = {}
    for r in load_prompts():
        by.setdefault(r["category"], []).append(r["turns"][0])
    prompts = [p for c in sorted(by) for p in by[c][:4]]
    out.mkdir(parents=True, exist_ok=True)
    generate_chunk(loaded, prompts, out / "chunk_0000.safetensors", layers=(2, 15, 27, "final_norm"),
                   max_new_tokens=128, sampled_fraction=0.0)
draft = load_eagle(default_eagle_path(), target.config.num_hidden_layers)
draft.bind_target(target)
teacher = target.get_output_embeddings().weight.detach()[draft.draft_ids].float()
args = argparse.Namespace(steps=3, tokens_per_batch=4096, max_len=768, bf16=True, decay=0.8)
hidden = int(target.config.hidden_size)
dev = DataCache.load(out)
print("dev answers", evaluate(draft, dev, list(range(dev.num_sequences)), args, teacher, hidden))
big = DataCache.load("/work/i24/data")
_, test = big.split(0.05, 0)
print("held-out (training generator)", evaluate(draft, big, test, args, teacher, hidden))
