"""A drafter on the main job's prompts (1 per category, 64 tokens), greedy, fp32 target: tau, tok/s incl. prefill.
    PYTHONPATH=TREE python3 mab.py DRAFTER [DRAFTER...]"""
import json, sys, time
from specdec_kernels import generate
from specdec_kernels.decoding.factory import make_drafter
from specdec_kernels.models import load_model
target = load_model(weights="float32")
rows = [json.loads(l) for l in open("/work/main/specdec_kernels/data/prompts_dev.jsonl")]
seen, prompts = set(), []
for r in rows:
    if r["category"] not in seen:
        seen.add(r["category"]); prompts.append(r["turns"][0])
tree = __import__("specdec_kernels").__file__.rsplit("/", 2)[0]
for name in sys.argv[1:]:
    steps = tok = 0; wall = dec = 0.0
    for p in prompts:
        d = None if name == "plain" else make_drafter(name)
        t = time.perf_counter()
        out = generate(target, [p], drafter=d, max_new_tokens=64)
        wall += time.perf_counter() - t
        steps += out.stats.target_forwards; tok += out.stats.new_tokens; dec += out.stats.decode_seconds
    print(tree, name, "tau %.2f, %.1f tok/s end to end, %.1f decode" % (tok / steps, tok / wall, tok / dec), flush=True)
