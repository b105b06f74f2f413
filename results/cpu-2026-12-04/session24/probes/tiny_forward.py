import time, torch, statistics
from transformers import LlamaConfig, LlamaForCausalLM
from specdec_kernels.decoding.runner import ModelRunner
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=30,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True)
model = LlamaForCausalLM(cfg).eval()
runner = ModelRunner(model)
prefix = 256
cache = runner.new_cache(1, prefix + 600)
with torch.inference_mode():
    runner.prefill(cache, [[(i * 7) % 200 + 10 for i in range(prefix)]])
    token = torch.tensor([[11]])
    for th in (2, 1, 2, 1):
        torch.set_num_threads(th)
        ts = []
        for _ in range(100):
            t = time.perf_counter(); runner.forward(cache, token, list(cache.host_lens)); cache.extend([1]); ts.append(time.perf_counter() - t)
        print(f"threads {th}: tiny 30-layer forward {1000*statistics.median(ts):.3f} ms ({1e6*statistics.median(ts)/30:.1f} us a layer)")
    with torch.profiler.profile() as prof:
        for _ in range(20):
            runner.forward(cache, token, list(cache.host_lens)); cache.extend([1])
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
