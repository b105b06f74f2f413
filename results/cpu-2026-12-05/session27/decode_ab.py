"""Decode tokens/s of the plain loop and the quantized-self drafter on the float32 target and the
plain loop at the GGUF file's precision, alternating per prompt in one process (outputs must
equal the plain loop's of the same weights); decode_ab.sh runs it alternately under the build
before this session's one-call path and after. Prompts: the tuning prompts (seeds 301-303),
never the dev prompts.
PYTHONPATH=<tree> python3 results/cpu-2026-12-05/session27/decode_ab.py [COUNT] [NEW]"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "cpu-2026-12-04/session26"))
import torch

from ab_lib import alternate, prompts_for
from specdec_kernels import ops
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.models import load_default_model

count = int(sys.argv[1]) if len(sys.argv) > 1 else 6
new = int(sys.argv[2]) if len(sys.argv) > 2 else 96
fp32 = load_default_model(dtype=torch.float32, weights="float32")
prompts = prompts_for(fp32, "short", count)
res = alternate(prompts, {
    "plain": lambda p, n: generate(fp32, [p], max_new_tokens=n),
    "quantized-self": lambda p, n: generate(fp32, [p], drafter=make_drafter("quantized-self"),
                                            max_new_tokens=n),
}, new)
file = load_default_model(dtype=torch.float32, weights="file")
res |= {f"file-{k}": v for k, v in alternate(prompts, {
    "plain": lambda p, n: generate(file, [p], max_new_tokens=n)}, new).items()}
print(json.dumps({"isa": ops.cpu_isa(),
                  **{m: round(n / s, 1) for m, (s, n, f) in res.items()},
                  "tau": {m: round(n / f, 2) for m, (s, n, f) in res.items()}}), flush=True)
