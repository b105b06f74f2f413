"""A/B of Medusa's shared-row gather at file precision: the old one (the head's rows gathered
from a dequantized copy every step, as before ecf09fb) against weight_rows (kept quantized,
once), one process, interleaved per prompt, tuning prompts (never the dev prompts)."""
import json, sys, time, torch
from specdec_kernels.decoding import generate
from specdec_kernels.decoding.medusa import MedusaDrafter
from specdec_kernels.medusa import heads as heads_mod
from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts, task_prompts
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels import ops

count = int(sys.argv[1]) if len(sys.argv) > 1 else 4
new = int(sys.argv[2]) if len(sys.argv) > 2 else 128
loaded = load_default_model(dtype=torch.float32, weights="file")
tok = loaded.tokenizer
first = first_stage_prompts(count, seed=301)
outs = [tok.decode(generate(loaded, encode_prompts(tok, [t]), max_new_tokens=96).tokens[0], skip_special_tokens=True) for t in first]
texts = first + second_stage_prompts(outs, count, seed=302) + task_prompts(list(zip(first, outs)), count, seed=303)
prompts = encode_prompts(tok, texts)
new_rows = heads_mod.MedusaHeads._shared_rows
def old_rows(self, lm_head):  # 30263d5's MedusaHeads._shared_rows, verbatim
    weight = lm_head.weight
    if self.draft_ids is None:
        return weight
    key = (weight.data_ptr(), weight.device, weight.dtype, self.draft_ids.device)
    if self._rows_cache is None or self._rows_cache[0] != key:
        rows = weight.detach()[self.draft_ids.to(weight.device)].contiguous()
        self._rows_cache = (key, rows)
    return self._rows_cache[1]
kinds = {"before": old_rows, "after": new_rows}
drafters = {k: MedusaDrafter() for k in kinds}
def run(k, p, n):
    heads_mod.MedusaHeads._shared_rows = kinds[k]
    return generate(loaded, [p], drafter=drafters[k], max_new_tokens=n)
for k in kinds:
    run(k, prompts[0], 16)
res = {k: {"s": 0.0, "tokens": 0, "forwards": 0, "out": []} for k in kinds}
plain = [generate(loaded, [p], max_new_tokens=new).tokens[0] for p in prompts]
for rep in range(2):
    for i, p in enumerate(prompts):
        for k in (list(kinds) if (i + rep) % 2 == 0 else list(kinds)[::-1]):
            t = time.perf_counter(); o = run(k, p, new); dt = time.perf_counter() - t
            r = res[k]; r["s"] += dt; r["tokens"] += o.stats.new_tokens; r["forwards"] += o.stats.target_forwards
            if rep == 0: r["out"].append(o.tokens[0])
summary = {"isa": ops.cpu_isa(), "weights": "file", "prompts": len(prompts), "new_tokens": new}
for k in kinds:
    r = res[k]
    summary[k] = {"tok_s": round(r["tokens"] / r["s"], 1), "tau": round(r["tokens"] / r["forwards"], 3),
                  "vs_before": round((r["tokens"] / r["s"]) / (res["before"]["tokens"] / res["before"]["s"]), 3),
                  "identical_to_plain": r["out"] == plain}
print(json.dumps(summary))
