"""Per step: target forward ms by width, and the verify/commit rest; plain vs EAGLE."""
import time, collections, json, sys
import torch
from specdec_kernels.data import load_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.decoding import engine as eng
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model

loaded = load_model("default", weights="float32")
prompts = [p["turns"][0] for p in load_prompts()][:240:40]
acc = collections.defaultdict(lambda: [0.0, 0])
orig_fwd = ModelRunner.forward
def fwd(self, cache, tokens, *a, **k):
    t = time.perf_counter(); out = orig_fwd(self, cache, tokens, *a, **k)
    if not k.get("prefill") and tokens.shape[1] <= 32:
        key = ("fwd", tokens.shape[1]); acc[key][0] += time.perf_counter() - t; acc[key][1] += 1
    return out
ModelRunner.forward = fwd
orig_vc = eng.Engine._verify_and_commit if hasattr(eng, "Engine") else None
cls = [c for c in vars(eng).values() if isinstance(c, type) and hasattr(c, "_verify_and_commit")][0]
orig_vc = cls._verify_and_commit
def vc(self, state, proposal, *a, **k):
    t = time.perf_counter(); out = orig_vc(self, state, proposal, *a, **k)
    acc[("vc", MODE)][0] += time.perf_counter() - t; acc[("vc", MODE)][1] += 1
    return out
cls._verify_and_commit = vc
for MODE in ["none", "eagle", "none", "eagle"]:
    d = make_drafter(MODE)
    generate(loaded, prompts[:1], drafter=d, max_new_tokens=8)
    acc.clear()
    secs = 0; steps = 0; new = 0; drafter = 0
    for p in prompts:
        s = generate(loaded, [p], drafter=d, max_new_tokens=64).stats
        secs += s.seconds - s.prefill_seconds; steps += s.target_forwards; new += s.new_tokens; drafter += s.drafter_seconds
    print(MODE, f"tau {new/steps:.2f} step {1e3*secs/steps:.2f} ms drafter {1e3*drafter/steps:.2f}")
    fw = {k[1]: (1e3*v[0]/v[1], v[1]) for k, v in acc.items() if k[0] == "fwd" and v[1] > 0}
    tot = sum(v[0] for k, v in acc.items() if k[0] == "fwd")
    print("  fwd by width (ms, n):", {w: (round(a, 2), n) for w, (a, n) in sorted(fw.items())})
    print(f"  fwd mean {1e3*tot/steps:.2f} ms; verify+commit total {1e3*acc[('vc', MODE)][0]/steps:.2f} ms")
