import time, llama_cpp
m = llama_cpp.Llama("/tmp/s19/qwen15b-shape.gguf", n_threads=2, n_ctx=1024, verbose=False)
toks = m.tokenize(b"Write a short story about a robot.")
s = time.perf_counter(); n = 0
for t in m.generate(toks, temp=0.0):
    n += 1
    if n == 64: break
print("llama.cpp tok/s (incl prefill)", n / (time.perf_counter() - s))
