"""One decoding forward (one token after 256 cached rows) of the default model through the
engine's runner, with DirectForward's per-forward glue as before this session (the stack
arguments rebuilt, every module's hooks looked up in a Python loop) and as now (both read in
C-level maps, the arguments cached), alternating in one process; median ms over 10 x 50.

    PYTHONPATH=. python3 results/cpu-2026-11-27/session17/glue_ab.py [file|float32|int4]

Valid at 7d21c33, where glue_ab.txt was measured: "before" calls _build_stack_arguments, which
then still kept each layer's own cache of its entries (removed after: the arguments' cache
replaced it), as the code before that commit did.
"""
import statistics
import sys
import time

import torch

from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from specdec_kernels.models.direct_forward import DirectForward

weights = sys.argv[1] if len(sys.argv) > 1 else "file"
if weights == "int4":
    from specdec_kernels.decoding.quantized import quantized_copy
    model = quantized_copy(load_model(weights="float32").model, 4, 32)
else:
    model = load_model(weights=weights).model
runner = ModelRunner(model)
prefix = 256
cache = runner.new_cache(1, prefix + 2)
runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
tokens = torch.tensor([[11]])
new_hooked, new_arguments = DirectForward.hooked, DirectForward.stack_arguments


def old_arguments(self, dtype, layers, takes):
    return self._build_stack_arguments(dtype, layers, takes)


def old_hooked(self):
    from torch.nn.modules import module as nn_module
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in self._modules)


def forwards(old: bool, n: int = 50) -> list:
    DirectForward.hooked = old_hooked if old else new_hooked
    DirectForward.stack_arguments = old_arguments if old else new_arguments
    out = []
    for _ in range(n):
        start = time.perf_counter()
        runner.forward(cache, tokens, [prefix])
        out.append((time.perf_counter() - start) * 1e3)
    return out


with torch.inference_mode():
    forwards(False, 20)
    times = {"before": [], "now": []}
    for _ in range(10):
        times["before"] += forwards(True)
        times["now"] += forwards(False)
median = {k: statistics.median(v) for k, v in times.items()}
print(f"{weights}: before {median['before']:.3f} ms, now {median['now']:.3f} ms, "
      f"now/before {median['now'] / median['before']:.3f}")
