import time, json, torch, sys, gc
from specdec_kernels.decoding import generate
from specdec_kernels.models import load_model
from specdec_kernels.training.prompts import first_stage_prompts
from specdec_kernels.models import encode_prompts
loaded = load_model(weights="float32")
tok = loaded.tokenizer
prompts = encode_prompts(tok, first_stage_prompts(6, seed=301))
drafter = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "plain" else None
generate(loaded.model, prompts[:1], max_new_tokens=16, drafter=drafter)
print("gc counts", gc.get_count(), "tracked objects", len(gc.get_objects()))
res = {"gc on": [0.0, 0], "gc off": [0.0, 0]}
collections_during = {"gc on": 0}
for rnd in range(2):
    for p in prompts:
        for mode in ("gc on", "gc off"):
            if mode == "gc off": gc.disable()
            before = sum(s["collections"] for s in gc.get_stats())
            t = time.perf_counter(); o = generate(loaded.model, [p], max_new_tokens=96, drafter=drafter)
            res[mode][0] += time.perf_counter() - t; res[mode][1] += o.stats.new_tokens
            if mode == "gc on": collections_during["gc on"] += sum(s["collections"] for s in gc.get_stats()) - before
            gc.enable()
print(drafter, {m: round(n / s, 2) for m, (s, n) in res.items()}, "collections with gc on:", collections_during, gc.get_stats())
