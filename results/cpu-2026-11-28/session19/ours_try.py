import time, torch
from specdec_kernels import generate
from specdec_kernels.models import load_model
s = time.perf_counter()
m = load_model("/tmp/s19/qwen15b-shape.gguf", weights="file")
print("load s", time.perf_counter() - s)
ids = m.tokenizer("Write a short story about a robot.")["input_ids"]
for _ in range(2):
    out = generate(m, [ids], max_new_tokens=64, eos_token_id=[])
    st = out.stats
    print("ours tok/s", st.new_tokens / (st.decode_seconds + st.prefill_seconds) if hasattr(st, "prefill_seconds") else st.new_tokens / st.decode_seconds, "decode only", st.new_tokens / st.decode_seconds)
print(out.tokens[0][:10])
