"""Per draft: depth, draft top-1 prob, top-2 prob, accepted (greedy), int4 quantized-self, K=6 fixed, no budget."""
import json, sys, torch
from specdec_kernels import generate
from specdec_kernels.decoding.quantized import QuantizedSelfDrafter
from specdec_kernels.models import load_model
from specdec_kernels.training.prompts import first_stage_prompts
target = load_model(weights="float32")
prompts = first_stage_prompts(24, seed=5)
rows = []
class Rec(QuantizedSelfDrafter):
    def _target_vocab(self, logits):
        out = super()._target_vocab(logits)
        p = torch.softmax(out.float(), -1).topk(2, -1).values[0]
        self._feat.append((float(p[0]), float(p[1])))
        return out
    def propose(self, state):
        self._feat = []
        return super().propose(state)
    def accept(self, state, outcome):
        n = outcome.num_accepted[0]
        if self._drafted == 0:
            return super().accept(state, outcome)
        for d in range(min(n + 1, self._depths[0])):
            rows.append((d + 1, *self._feat[d], int(d < n)))
        super().accept(state, outcome)
for p in prompts:
    d = Rec(num_draft=6, budget=False)
    generate(target, [p], drafter=d, max_new_tokens=128)
json.dump(rows, open("/tmp/s18/qcal.json", "w"))
print(len(rows))
