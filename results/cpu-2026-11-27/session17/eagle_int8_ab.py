"""EAGLE with its float32 draft against draft_dtype="int8", alternating, 12 dev prompts x 128
tokens, greedy, float32 target: tau, decode tokens/s, drafter ms a step.

    PYTHONPATH=. python3 results/cpu-2026-11-27/session17/eagle_int8_ab.py
"""
import json, time, sys
from specdec_kernels import generate
from specdec_kernels.decoding.factory import make_drafter
from specdec_kernels.models import load_model
target = load_model(weights="float32")
prompts = [json.loads(l)["turns"][0] for l in open("specdec_kernels/data/prompts_dev.jsonl")][::20][:12]
for rnd in range(2):
    for mode in ("float32", "int8"):
        steps = dec = dsec = tok = 0
        for p in prompts:
            d = make_drafter("eagle", draft_dtype=mode)
            out = generate(target, [p], drafter=d, max_new_tokens=128)
            steps += out.stats.target_forwards; dec += out.stats.decode_seconds; dsec += out.stats.drafter_seconds; tok += out.stats.new_tokens
        print(mode, "tau %.2f, %.1f tok/s decode, drafter %.2f ms/step, step %.2f ms" % (tok/steps, tok/dec, dsec/steps*1e3, dec/steps*1e3))
