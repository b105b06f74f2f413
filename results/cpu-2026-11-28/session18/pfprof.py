import json, time, torch
from torch.profiler import profile, ProfilerActivity
from specdec_kernels import generate
from specdec_kernels.models import load_model
target = load_model(weights="float32")
rows=[json.loads(l) for l in open('/work/main/specdec_kernels/data/prompts_dev.jsonl')]
p = [r for r in rows if r['category']=='rag'][0]['turns'][0]
generate(target, [p], max_new_tokens=1)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as pr:
    generate(target, [p], max_new_tokens=1)
print(pr.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=40, max_shapes_column_width=70))
