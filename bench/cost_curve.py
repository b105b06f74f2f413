"""Step cost of a target model against the number of tokens verified per step.

Acceptance is a property of the models; step cost is a property of the hardware. This tool
measures the second: the latency of one forward pass over T new tokens (T = 1 ... 128) after a
fixed prefix already in the KV cache, for real model shapes with random weights (no download
needed), on whatever device is given.

    python3 -m bench.cost_curve --device cuda --dtype bfloat16 --models 135m,1.5b,7b --out curve.json
    python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --out curve-cpu.json

The JSON holds, per model, the median latency (ms) for each T and the ratio cost(T)/cost(1);
``bench.projection`` combines it with measured acceptance to project speedups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

# Shapes of real models (public configurations), instantiated with random weights.
MODEL_SHAPES = {
    "135m": dict(  # SmolLM2-135M
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
    ),
    "1.5b": dict(  # Qwen2-1.5B
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
    ),
    "7b": dict(  # Llama-2-7B
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False,
    ),
}
DEFAULT_TOKENS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]


def build_model(name: str, device: str, dtype: torch.dtype):
    """A random-weight causal LM with the shape of `name`, in eval mode on `device`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(MODEL_SHAPES[name])
    config = AutoConfig.for_model(shape.pop("model_type"), max_position_embeddings=8192, **shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _crop(cache, length: int) -> None:
    # A negative argument removes that many tokens in every transformers version we support.
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@torch.inference_mode()
def step_latencies(model, prefix: int, tokens: list[int], repeats: int) -> dict[int, float]:
    """Median latency (ms) of one forward over T tokens after `prefix` cached tokens, per T.

    The cache is cropped back to the prefix before every timed step, so each step sees the
    same context length, as a verification step does.
    """
    from transformers import DynamicCache

    device = str(model.device)
    vocab = model.config.vocab_size
    cache = DynamicCache(config=model.config)
    prompt = torch.randint(vocab, (1, prefix), device=device)
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    result = {}
    for t in tokens:
        new = torch.randint(vocab, (1, t), device=device)
        positions = torch.arange(prefix, prefix + t, device=device).unsqueeze(0)
        times = []
        for i in range(repeats + 2):  # two warm-up steps
            _crop(cache, prefix)
            _synchronize(device)
            start = time.perf_counter()
            model(input_ids=new, past_key_values=cache, position_ids=positions, use_cache=True)
            _synchronize(device)
            if i >= 2:
                times.append(time.perf_counter() - start)
        result[t] = statistics.median(times) * 1e3
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--models", default="135m", help=f"comma list of {sorted(MODEL_SHAPES)}")
    parser.add_argument("--prefix", type=int, default=512, help="tokens already in the cache")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)

    tokens = [int(t) for t in args.tokens.split(",")]
    dtype = getattr(torch, args.dtype)
    device_name = (
        torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    )
    report = {
        "device": device_name,
        "dtype": args.dtype,
        "prefix": args.prefix,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "models": {},
    }
    for name in args.models.split(","):
        if name not in MODEL_SHAPES:
            raise SystemExit(f"unknown model {name!r}; choose from {sorted(MODEL_SHAPES)}")
        model = build_model(name, args.device, dtype)
        latencies = step_latencies(model, args.prefix, tokens, args.repeats)
        base = latencies[tokens[0]]
        report["models"][name] = {
            "layers": model.config.num_hidden_layers,
            "latency_ms": {str(t): round(ms, 3) for t, ms in latencies.items()},
            "relative_cost": {str(t): round(ms / base, 3) for t, ms in latencies.items()},
        }
        print(f"{name} on {device_name} ({args.dtype}, prefix {args.prefix}):")
        for t, ms in latencies.items():
            print(f"  T={t:4d}  {ms:9.2f} ms  {ms / base:6.2f}x")
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
