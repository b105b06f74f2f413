"""Synthetic Qwen2.5-1.5B / 0.5B shapes at file precision (Q4_K_M mix): c(1) of the target, one
draft token of the 0.5B with its full head and with heads over N tokens (draft_vocab, id order),
interleaved rounds, medians (prefix 512)."""
import json, statistics, sys, torch
from bench.quantized_cost import one_token_ms
from specdec_kernels import ops
from specdec_kernels.decoding.draft_vocabulary import draft_vocabulary, restricted_head_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
target = ModelRunner(load_model("/tmp/s19/qwen15b-shape.gguf", weights="file").model)
dmodel = load_model("/tmp/s19/qwen05b-shape.gguf", weights="file").model
draft = ModelRunner(dmodel)
V = draft.vocab_size
prefix = 512
cases = {"target T=1": target, "draft": draft}
for n in (32768, 16384, 8192):
    cases[f"draft vocab{n}"] = ModelRunner(restricted_head_copy(dmodel, draft_vocabulary(list(range(V)), n)))
times = {k: [] for k in cases}
with torch.inference_mode():
    for k, r in cases.items(): one_token_ms(r, prefix, 2)
    for _ in range(3):
        for k, r in cases.items(): times[k] += one_token_ms(r, prefix, 5)
med = {k: round(statistics.median(v), 2) for k, v in times.items()}
c1 = med["target T=1"]
head = dmodel.get_output_embeddings().weight
out = {"isa": ops.cpu_isa(), "prefix": prefix, "draft_head": repr(head), "ms": med,
       "over_target": {k: round(v / c1, 3) for k, v in med.items()}}
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
