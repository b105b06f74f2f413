"""What Medusa heads cost against a target step, on the default model and this device.

Times (median of ``--repeats``, after warm-up), at batch 1:
- a one-token target step (our runner, ``--prefix`` tokens already cached);
- one full-vocabulary projection (the LM head over one hidden state);
- the shipped heads (their residual blocks and draft-vocabulary projections);
- the same number of heads over the full vocabulary.

    python3 -m bench.medusa_cost [--heads FOLDER] [--prefix 300] [--repeats 50] [--out cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def measure(heads_path=None, prefix: int = 300, repeats: int = 50) -> dict:
    from specdec_kernels.decoding.medusa import load_default_heads
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.medusa.heads import MedusaHeads, load_heads
    from specdec_kernels.models import load_model

    loaded = load_model()
    model = loaded.model
    runner = ModelRunner(model)
    heads = load_heads(heads_path) if heads_path else load_default_heads()
    lm_head = model.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape

    cache = runner.new_cache(1, prefix + 8)
    runner.append(cache, [list(range(100, 100 + prefix))])
    token = torch.tensor([[42]])

    def target_step():
        runner.forward(cache, token, cache.host_lens)

    x = torch.randn(1, hidden)
    full_heads = MedusaHeads(hidden, vocab, heads.num_heads, heads.num_layers)
    out = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "prefix": prefix,
        "target_step_ms": _median_ms(target_step, repeats),
        "full_vocab_projection_ms": _median_ms(lambda: lm_head(x), repeats),
        "heads": {"num_heads": heads.num_heads, "num_layers": heads.num_layers,
                  "projection": heads.projection, "draft_vocab": heads.output_size},
        "heads_ms": _median_ms(lambda: heads(x, lm_head), repeats),
        "full_vocab_heads_ms": _median_ms(lambda: full_heads(x, lm_head), repeats),
    }
    out["full_vocab_projection_share"] = out["full_vocab_projection_ms"] / out["target_step_ms"]
    out["heads_share"] = out["heads_ms"] / out["target_step_ms"]
    out["full_vocab_heads_share"] = out["full_vocab_heads_ms"] / out["target_step_ms"]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", help="heads folder (default: the shipped heads)")
    parser.add_argument("--prefix", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", help="JSON file to write")
    args = parser.parse_args(argv)
    result = measure(args.heads, args.prefix, args.repeats)
    h = result["heads"]
    print(f"target one-token step ({result['prefix']} cached): "
          f"{result['target_step_ms']:.2f} ms")
    print(f"one full-vocabulary projection: {result['full_vocab_projection_ms']:.2f} ms "
          f"({result['full_vocab_projection_share']:.1%} of a step)")
    print(f"{h['num_heads']} heads, {h['projection']} projection over {h['draft_vocab']} "
          f"tokens: {result['heads_ms']:.2f} ms ({result['heads_share']:.1%})")
    print(f"{h['num_heads']} heads over the full vocabulary: {result['full_vocab_heads_ms']:.2f} "
          f"ms ({result['full_vocab_heads_share']:.1%})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
