"""In-process A/B of the rotary table: draft (int4 copy, re-scored head) and float32 target
forwards, one token after 256 rows, the table against the module's own call, alternating."""
import statistics, sys, time
import torch
sys.path.insert(0, "/work/main")
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models import load_model
from specdec_kernels.models.direct_forward import DirectForward

loaded = load_model(weights="float32")
draft = ModelRunner(quantized_copy(loaded.model, bits=4, group=32, head_bits=4, rerank=4))
target = ModelRunner(loaded.model)
table = DirectForward._rotary
module = lambda self, hidden, positions: self.decoder.rotary_emb(hidden, position_ids=positions)  # noqa: E731
res = {}
with torch.inference_mode():
    for name, runner, kv in (("draft", draft, draft.narrow_kv_dtype()), ("target", target, None)):
        cache = runner.new_cache(1, 400, kv)
        runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(256)]])
        tok = torch.tensor([[11]])
        for rnd in range(6):
            for variant, fn in (("table", table), ("module", module)):
                DirectForward._rotary = fn
                for _ in range(3):
                    runner.forward(cache, tok, [256])
                ts = []
                for _ in range(40):
                    s = time.perf_counter(); runner.forward(cache, tok, [256]); ts.append(time.perf_counter() - s)
                res.setdefault((name, variant), []).append(statistics.median(ts) * 1e3)
DirectForward._rotary = table
for name in ("draft", "target"):
    t, m = res[(name, "table")], res[(name, "module")]
    print(name, "table", [round(x, 3) for x in t], "module", [round(x, 3) for x in m],
          "median diff", round(statistics.median(m) - statistics.median(t), 3), "ms")
