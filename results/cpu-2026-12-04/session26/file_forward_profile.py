"""Where a file-precision (GGUF) forward of the default model spends its time at T = 1 and T = 8
rows after 256 cached tokens: torch.profiler's op table (self CPU time) over 20 forwards each.
PYTHONPATH=. python3 results/cpu-2026-12-04/session26/file_forward_profile.py [WEIGHTS]"""
import sys
import torch
from torch.profiler import profile, ProfilerActivity
from specdec_kernels.decoding import ModelRunner
from specdec_kernels.decoding.calibration import _forward_block
from specdec_kernels.models import load_default_model

weights = sys.argv[1] if len(sys.argv) > 1 else "file"
loaded = load_default_model(weights=weights)
runner = ModelRunner(loaded.model)
print(runner.kernels.describe())
calls = _forward_block(runner, (1, 8), 256, torch.Generator().manual_seed(0))
with torch.inference_mode():
    for t, call in calls.items():
        for _ in range(5):
            call()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                call()
        print(f"=== T = {t}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
