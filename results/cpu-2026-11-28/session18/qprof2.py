"""Where the quantized-self step goes, timed in place (perf_counter wrappers)."""
import json, time, collections, torch
from specdec_kernels import generate, ops
import specdec_kernels.ops as opsmod
from specdec_kernels.decoding.factory import make_drafter
from specdec_kernels.decoding import draft_model, chain_drafter
from specdec_kernels.decoding.quantized import QuantizedSelfDrafter
import specdec_kernels.models.direct_forward as dfm
from specdec_kernels.models import load_model
target = load_model(weights="float32")
prompts = [json.loads(l)["turns"][0] for l in open("/work/main/specdec_kernels/data/prompts_dev.jsonl")][::20][:12]
T = collections.defaultdict(float); N = collections.defaultdict(int)
ctx = ["target"]
def wrap(obj, name, label, setctx=None):
    f = getattr(obj, name)
    def g(*a, **k):
        if setctx: ctx.append(setctx)
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            dt = time.perf_counter() - t
            if setctx: ctx.pop()
            key = label if setctx else f"{ctx[-1]}:{label}"
            T[key] += dt; N[key] += 1
    setattr(obj, name, g)
wrap(QuantizedSelfDrafter, "_first_logits", "draft first_logits", "draft")
wrap(QuantizedSelfDrafter, "_next_logits", "draft next_logits", "draft")
wrap(QuantizedSelfDrafter, "propose", "propose total", "draft")
wrap(QuantizedSelfDrafter, "accept", "accept total", "draft")
wrap(torch.ops.specdec, "decoder_stack_", "decoder_stack_")
wrap(dfm.DirectForward, "stacked", "stacked")
wrap(dfm.DirectForward, "_logits", "head")
wrap(ops, "sample", "ops.sample")
from specdec_kernels.decoding.runner import ModelRunner
wrap(ModelRunner, "append", "runner.append")
wrap(ModelRunner, "forward", "runner.forward")
from specdec_kernels.decoding.cache import KVCache
wrap(KVCache, "compact", "cache.compact")
steps = dec = 0
for p in prompts:
    out = generate(target, [p], drafter=make_drafter("quantized-self"), max_new_tokens=128)
    steps += out.stats.target_forwards; dec += out.stats.decode_seconds
print("steps", steps, "step ms %.2f" % (dec / steps * 1e3))
for k in sorted(T): print(f"{k:40s} {T[k]/steps*1e3:7.3f} ms/step  {N[k]/steps:5.2f} calls/step  {T[k]/N[k]*1e3:7.3f} ms/call")
