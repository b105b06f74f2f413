"""Does a step-cost curve measured at the request's context size better the trees on long
prompts? The multi drafter sized by the float32 c(T) measured after 256 cached tokens against
the same drafter sized by the curve measured after 2048 (this session's final/ curves), beside
the plain loop, alternating per prompt in one process. Long prompts are built from the
package's own prompt generator (seed 311, never the dev prompts): the target's greedy answers
to 24 generic requests, 12 of them per prompt as notes, then a summarization or listing request.
From the repository root: PYTHONPATH=. python3 results/.../long_context_curve_ab.py ISA_TAG [prompts]
[tokens] [notes a prompt] [drafter]"""
import json, sys, time
import torch
from specdec_kernels import ops
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.models import encode_prompts, load_default_model
from specdec_kernels.training.prompts import first_stage_prompts

tag = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 6
new = int(sys.argv[3]) if len(sys.argv) > 3 else 96
notes = int(sys.argv[4]) if len(sys.argv) > 4 else 12
drafter = sys.argv[5] if len(sys.argv) > 5 else "multi"
curves = {f"{drafter}-p256": f"results/cpu-2026-12-04/session25/final/cost_fp32_{tag}_p256{'_rerun' if tag == 'avx512_bf16' else ''}.json",
          f"{drafter}-p2048": f"results/cpu-2026-12-04/session25/final/cost_fp32_{tag}_p2048{'_rerun' if tag == 'avx512_bf16' else ''}.json"}
loaded = load_default_model(dtype=torch.float32, weights="float32")  # the curves are float32's
tok = loaded.tokenizer
requests = first_stage_prompts(24, seed=311)
answers = [tok.decode(generate(loaded, encode_prompts(tok, [r]), max_new_tokens=96).tokens[0],
                      skip_special_tokens=True) for r in requests]
asks = ["Summarize the notes above in a few sentences.", "List the main topics of the notes above."]
texts = ["Notes:\n\n" + "\n\n".join(answers[(i + j) % 24] for j in range(notes)) + "\n\n" + asks[i % 2]
         for i in range(count)]
prompts = encode_prompts(tok, texts)
methods = {"plain": lambda: None,
           **{name: (lambda path=path: make_drafter(drafter, cost_curve=path)) for name, path in curves.items()}}
for make in methods.values():
    generate(loaded, prompts[:1], drafter=make(), max_new_tokens=8)
res = {m: [0.0, 0, 0] for m in methods}
for p in prompts:
    ref = None
    for m, make in methods.items():
        o = generate(loaded, [p], drafter=make(), max_new_tokens=new)
        res[m][0] += o.stats.decode_seconds; res[m][1] += o.stats.new_tokens
        res[m][2] += o.stats.requests[0].target_forwards
        ref = o.tokens[0] if ref is None else ref
        assert o.tokens[0] == ref, m
print(json.dumps({"isa": ops.cpu_isa(), "drafter": drafter, "prompts": len(prompts),
                  "prompt_tokens": [len(p) for p in prompts], "new_tokens": new,
                  **{m: {"decode tok/s": round(n / s, 1), "tau": round(n / f, 2)} for m, (s, n, f) in res.items()}}))
