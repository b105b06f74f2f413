import time, sys, llama_cpp
for path in ("/tmp/s19/qwen15b-shape.gguf", "/tmp/s19/qwen05b-shape.gguf"):
    m = llama_cpp.Llama(path, n_threads=2, n_ctx=1024, verbose=False)
    toks = m.tokenize(b"Write a short story about a robot.")
    best = 0
    for _ in range(2):
        m.reset()
        n = 0; s = None
        for t in m.generate(toks, temp=0.0):
            if s is None: s = time.perf_counter()  # after prefill and the first token
            n += 1
            if n == 65: break
        best = max(best, 64 / (time.perf_counter() - s))
    print(path.split("/")[-1], "llama.cpp decode tok/s", round(best, 1), "ms/token", round(1000 / best, 2))
