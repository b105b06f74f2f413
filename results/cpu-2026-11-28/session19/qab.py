"""quantized-self on 12 dev prompts x 128 tokens, greedy, fp32 target: tau, tok/s, drafter ms a step.
    PYTHONPATH=TREE python3 qab.py NAME=k:v,... ..."""
import json, sys
from specdec_kernels import generate
from specdec_kernels.decoding.factory import make_drafter
from specdec_kernels.models import load_model
target = load_model(weights="float32")
prompts = [json.loads(l)["turns"][0] for l in open("/work/main/specdec_kernels/data/prompts_dev.jsonl")][::20][:12]
tree = sys.path[0] if False else __import__("specdec_kernels").__file__.rsplit("/", 2)[0]
for arg in sys.argv[1:]:
    name, _, opts = arg.partition("=")
    kw = {k: int(v) for k, v in (o.split(":") for o in opts.split(",") if o)}
    steps = dec = dsec = tok = 0
    for p in prompts:
        d = None if name == "plain" else make_drafter("quantized-self", **kw)
        out = generate(target, [p], drafter=d, max_new_tokens=128)
        steps += out.stats.target_forwards; dec += out.stats.decode_seconds; dsec += out.stats.drafter_seconds; tok += out.stats.new_tokens
    rep = out.stats.drafter_report.get("budget", {}) if d else {}
    print(tree, name, "tau %.2f, %.1f tok/s decode, drafter %.2f ms/step, step %.2f ms" % (tok/steps, tok/dec, dsec/steps*1e3, dec/steps*1e3), "last lengths", rep.get("lengths"), flush=True)
