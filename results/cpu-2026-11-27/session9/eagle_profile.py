# cProfile of greedy EAGLE decoding (shipped drafter, 4 dev prompts of qa/writing, 96 tokens each), AVX-512 path.
import cProfile, pstats, time, torch
from specdec_kernels.models import load_model, encode_prompts
from specdec_kernels.decoding import generate
from specdec_kernels.decoding.eagle import EagleDrafter
from specdec_kernels.data import load_prompts
loaded = load_model("default")
rows = load_prompts()
prompts = [r["turns"][0] for r in rows if r["category"] in ("qa", "writing")][:4]
ids = encode_prompts(loaded.tokenizer, prompts)
generate(loaded.model, ids[:1], drafter="eagle", tokenizer=loaded.tokenizer, max_new_tokens=16)
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
for p in ids:
    generate(loaded.model, [p], drafter="eagle", tokenizer=loaded.tokenizer, max_new_tokens=96)
pr.disable()
print("wall", time.perf_counter() - t0)
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(r"eagle|drafter|engine|runner", 30)
