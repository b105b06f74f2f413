"""One decoding forward (prefix 256) of the float32 target, the default int4 quantized-self
draft (bfloat16 K/V) and the file-precision target, with the linears' work over threads by
static halves or claimed in chunks (SPECDEC_AB_CLAIM, a switch of the probed build only),
alternating in one process: median ms and claim/static."""
import os
import statistics
import sys

import torch

from bench.quantized_cost import one_token_ms
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
target = load_model(weights="float32").model
draft = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4)
fileprec = load_model(weights="file").model
draft_runner = ModelRunner(draft)
runners = {"fp32-target": (ModelRunner(target), None),
           "int4-draft": (draft_runner, draft_runner.narrow_kv_dtype()),
           "file-target": (ModelRunner(fileprec), None)}
times = {(n, c): [] for n in runners for c in (0, 1)}
with torch.inference_mode():
    for name, (runner, kv) in runners.items():
        one_token_ms(runner, 256, 3, kv_dtype=kv)
    for r in range(rounds):
        for name, (runner, kv) in runners.items():
            for c in ((0, 1) if r % 2 == 0 else (1, 0)):
                if c:
                    os.environ["SPECDEC_AB_CLAIM"] = "1"
                else:
                    os.environ.pop("SPECDEC_AB_CLAIM", None)
                times[name, c] += one_token_ms(runner, 256, 5, kv_dtype=kv)
print(f"isa {__import__('specdec_kernels').ops.cpu_isa()} threads {torch.get_num_threads()} rounds {rounds}")
for name in runners:
    a, b = statistics.median(times[name, 0]), statistics.median(times[name, 1])
    print(f"{name:12s} static {a:7.3f} ms  claim {b:7.3f} ms  claim/static {b / a:.3f}")
