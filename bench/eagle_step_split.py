"""Where a decoding step goes, plain loop against EAGLE: the default model, the dev prompts'
first turns (one per category), one request at a time, 64 new tokens, greedy; from the engine's
own statistics (decode time, drafter time, target forwards).

    python3 bench/eagle_step_split.py
"""

import time
from specdec_kernels.models import load_model
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.data import load_prompts
m = load_model("default", weights="float32")
prompts = [p["turns"][0] for p in load_prompts()][:240:40]
for name in ["none", "eagle"]:
    d = make_drafter(name)
    generate(m, prompts[:1], drafter=d, max_new_tokens=8)
    tot = dict(seconds=0, prefill=0, drafter=0, steps=0, new=0)
    for p in prompts:
        s = generate(m, [p], drafter=d, max_new_tokens=64).stats
        tot["seconds"] += s.seconds; tot["prefill"] += s.prefill_seconds; tot["drafter"] += s.drafter_seconds
        tot["steps"] += s.target_forwards; tot["new"] += s.new_tokens
    dec = tot["seconds"] - tot["prefill"]
    print(name, "tau", round(tot["new"] / tot["steps"], 2), "decode ms/step", round(1e3 * dec / tot["steps"], 1),
          "drafter ms/step", round(1e3 * tot["drafter"] / tot["steps"], 1),
          "rest ms/step", round(1e3 * (dec - tot["drafter"]) / tot["steps"], 1), "tok/s", round(tot["new"] / tot["seconds"], 1))
