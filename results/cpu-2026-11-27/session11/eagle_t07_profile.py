import cProfile, pstats, time
from specdec_kernels.data import load_prompts
from specdec_kernels.decoding import generate, make_drafter
from specdec_kernels.models import load_model
loaded = load_model("default", weights="float32")
prompts = [p["turns"][0] for p in load_prompts()][:240:40]
kw = dict(temperature=0.7, top_p=0.9, seed=0, max_new_tokens=64)
for greedy in (False,):
    d = make_drafter("eagle")
    k = dict(max_new_tokens=64) if greedy else kw
    generate(loaded, prompts[:1], drafter=d, **{**k, "max_new_tokens": 8})
    pr = cProfile.Profile(); pr.enable()
    steps = dr = 0
    for p in prompts:
        s = generate(loaded, [p], drafter=d, **k).stats
        steps += s.target_forwards; dr += s.drafter_seconds
    pr.disable()
    print("greedy" if greedy else "T0.7", f"drafter {1e3*dr/steps:.2f} ms/step, steps {steps}")
    st = pstats.Stats(pr); st.sort_stats("cumtime")
    st.print_stats(r"eagle.py|sampling|multinomial|propose|accept", 25)
