import sys, time, torch
from specdec_kernels.models import load_model
from specdec_kernels.training.selfdistill import self_written_prompts, user_turn_prefix
loaded = load_model("default")
print(loaded.tokenizer.decode(user_turn_prefix(loaded.tokenizer)))
t = time.perf_counter()
ps = self_written_prompts(loaded, int(sys.argv[1]), seed=int(sys.argv[2]), temperature=float(sys.argv[3]), top_p=float(sys.argv[4]))
print(f"{len(ps)} prompts in {time.perf_counter()-t:.1f} s")
for p in ps: print("----\n" + p[:400])
