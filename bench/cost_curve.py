"""Step cost of a target model against the number of tokens verified per step.

Acceptance is a property of the models; step cost is a property of the hardware. This tool
measures the second: the latency of one forward pass over T new tokens (T = 1 ... 128) after a
fixed prefix already in the KV cache, for real model shapes with random weights (no download
needed), on whatever device is given, along two paths, interleaved T by T:

- ``engine``: the decoding engine's own forward (:class:`ModelRunner` with its preallocated
  cache and the device's default kernels: on CPU the package's batch-invariant small-batch
  linear and tree attention);
- ``torch``: Hugging Face's own forward as ``generate`` runs it (DynamicCache, sdpa, torch's
  linears).

    python3 -m bench.cost_curve --device cuda --dtype bfloat16 --models 135m,1.5b,7b --out curve.json
    python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m,1.5b --out curve-cpu.json
    python3 -m bench.cost_curve --device cpu --dtype float32 --weights int4 --models 1.5b
    python3 -m bench.cost_curve --device cpu --dtype float32 --models 135m --isa avx2

``--weights int4|int8`` quantizes every linear (groups of 32, the formats a GGUF file's
``Q4_*`` / ``Q8_0`` blocks repack into) and runs them through ``quantized_linear``: the step
cost at a file's precision. ``--isa avx2`` runs an AVX-512 machine as an AVX2 one would: the
package's kernels on their AVX2 path and torch's on theirs
(:func:`specdec_kernels.bench.machine.cap_isa`).

The JSON holds, per model, the median latency (ms) for each T and the ratio cost(T)/cost(1),
``latency_ms`` / ``relative_cost`` for the engine and ``torch_latency_ms`` /
``torch_relative_cost`` for torch; ``bench.projection`` combines them with measured acceptance
to project speedups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdec_kernels.bench import machine

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


def torch_step(model, prefix: int):
    """A function of T tokens running HF's own forward over them after `prefix` cached tokens
    (the cache cropped back to the prefix every time, as a verification step sees it)."""
    from transformers import DynamicCache

    from specdec_kernels.models.hf_compat import cache_kwargs

    device = str(model.device)
    cache = DynamicCache(config=model.config)
    prompt = torch.randint(model.config.vocab_size, (1, prefix), device=device)
    cached = cache_kwargs(model, cache)
    model(input_ids=prompt, use_cache=True, **cached)

    def step(new):
        positions = torch.arange(prefix, prefix + new.shape[1], device=device).unsqueeze(0)
        _crop(cache, prefix)
        model(input_ids=new, position_ids=positions, use_cache=True, **cached)

    return step


def engine_step(model, prefix: int, capacity: int):
    """The same through the engine's ModelRunner (its cache and default kernels); rows past
    the prefix are rewritten by every call and never committed. Returns (step, runner)."""
    from specdec_kernels.decoding.runner import ModelRunner

    runner = ModelRunner(model)
    cache = runner.new_cache(1, capacity)
    runner.append(cache, [torch.randint(model.config.vocab_size, (prefix,)).tolist()])
    return (lambda new: runner.forward(cache, new, cache.host_lens)), runner


def _timed_ms(step, device: str) -> float:
    _synchronize(device)
    start = time.perf_counter()
    step()
    _synchronize(device)
    return (time.perf_counter() - start) * 1e3


@torch.inference_mode()
def step_latencies(model, prefix: int, tokens: list[int], repeats: int) -> dict[str, dict]:
    """Median latency (ms) of one forward over T tokens after `prefix` cached tokens, per T,
    for the engine's and torch's paths. Interleaved: each round times every T on both paths
    (after two warm-up rounds), so a drift of the machine's speed spreads over the whole curve
    instead of bending it (T by T, a noisy machine gave c(16) < c(8))."""
    device = str(model.device)
    vocab = model.config.vocab_size
    engine, runner = engine_step(model, prefix, prefix + max(tokens))
    baseline = torch_step(model, prefix)
    blocks = {t: torch.randint(vocab, (1, t), device=device) for t in tokens}
    samples = {path: {t: [] for t in tokens} for path in ("engine", "torch")}
    try:
        for round_ in range(repeats + 2):
            for t in tokens:
                engine_ms = _timed_ms(lambda: engine(blocks[t]), device)
                runner.release()  # torch's path runs the model's own attention
                torch_ms = _timed_ms(lambda: baseline(blocks[t]), device)
                if round_ >= 2:
                    samples["engine"][t].append(engine_ms)
                    samples["torch"][t].append(torch_ms)
    finally:
        runner.release()
    result = {path: {t: statistics.median(v) for t, v in by_t.items()}
              for path, by_t in samples.items()}
    result["kernels"] = runner.kernels.describe()
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--models", default="135m", help=f"comma list of {sorted(MODEL_SHAPES)}")
    parser.add_argument("--prefix", type=int, default=512, help="tokens already in the cache")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--weights", default="float", choices=["float", "int4", "int8"],
                        help="linear weights: the dtype's, or quantized (groups of 32)")
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--isa", choices=machine.ISA_CHOICES,
                        help="run the CPU kernels (the package's and torch's) at this "
                        "instruction set (default: the best this CPU has)")
    args = parser.parse_args(argv)
    machine.cap_isa(args.isa)

    tokens = [int(t) for t in args.tokens.split(",")]
    dtype = getattr(torch, args.dtype)
    device_name = (
        torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    )
    report = {
        "device": device_name,
        "machine": machine.machine_info(args.device),
        "dtype": args.dtype,
        "weights": args.weights,
        "prefix": args.prefix,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "models": {},
    }
    for name in args.models.split(","):
        if name not in MODEL_SHAPES:
            raise SystemExit(f"unknown model {name!r}; choose from {sorted(MODEL_SHAPES)}")
        model = build_model(name, args.device, dtype)
        if args.weights != "float":
            from specdec_kernels.models.quantized_weight import quantize_model

            quantize_model(model, 4 if args.weights == "int4" else 8, 32)
        paths = step_latencies(model, args.prefix, tokens, args.repeats)
        report.setdefault("kernels", {})[name] = paths.pop("kernels")
        engine, baseline = paths["engine"], paths["torch"]
        base, torch_base = engine[tokens[0]], baseline[tokens[0]]
        report["models"][name] = {
            "layers": model.config.num_hidden_layers,
            "latency_ms": {str(t): round(ms, 3) for t, ms in engine.items()},
            "relative_cost": {str(t): round(ms / base, 3) for t, ms in engine.items()},
            "torch_latency_ms": {str(t): round(ms, 3) for t, ms in baseline.items()},
            "torch_relative_cost": {str(t): round(ms / torch_base, 3) for t, ms in baseline.items()},
        }
        print(f"{name} on {device_name} ({args.dtype}, prefix {args.prefix}, "
              f"{report['machine']['cpu_isa']}, {report['machine']['threads']} threads, engine "
              f"on the {report['kernels'][name]['path']} kernels): engine | torch")
        for t in tokens:
            print(f"  T={t:4d}  {engine[t]:9.2f} ms {engine[t] / base:6.2f}x | "
                  f"{baseline[t]:9.2f} ms {baseline[t] / torch_base:6.2f}x "
                  f"({engine[t] / torch_base:5.2f}x torch's c(1))")
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        # After every model: a run stopped at a time limit keeps the models it measured.
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
