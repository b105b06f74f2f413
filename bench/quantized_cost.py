"""Draft cost of the quantized-self prophet against the fp32 target on this machine: the
latency of one decoding forward (one token after a prefix already in the cache) of the default
model as the engine runs it (fp32, the package's CPU kernels) and of its int4 and int8 copies
(``QuantizedSelfDrafter``'s draft models, ``quantized_linear``; ``int4-copy`` with an int4 LM
head, ``int4-copy-head8`` with an int8 head, ``int4-copy-rerank4`` with an int4 head whose top 4
logits are re-scored with the target's rows (``rerank=4``); the copies' K/V in bfloat16 as
the drafter keeps them, ``narrow_kv``, and ``int4-copy-head8-f32kv`` in float32),
interleaved, median over repeats. ``--draft-vocab N`` (repeatable) adds
``int4-copy-head8-vocabN``: that copy with its LM head over the ``N`` most frequent tokens
(the drafter's ``draft_vocab``, ranked by the package's ranking for the default model).

    python3 -m bench.quantized_cost --prefix 256 --repeats 30 --draft-vocab 8192 --out cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def one_token_ms(runner, prefix: int, repeats: int, width: int = 1, kv_dtype=None) -> list:
    """Latencies (ms) of forwards of ``width`` tokens after ``prefix`` cached rows (K/V in
    ``kv_dtype``, default the model's)."""
    cache = runner.new_cache(1, prefix + width + 1, kv_dtype)
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    tokens = torch.tensor([[11] * width])
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.forward(cache, tokens, [prefix])
        out.append(1000 * (time.perf_counter() - start))
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--draft-vocab", type=int, action="append", default=[])
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from specdec_kernels.decoding.quantized import quantized_copy
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.models import load_model

    from specdec_kernels.decoding.draft_vocabulary import (
        draft_vocabulary,
        restricted_head_copy,
        token_ranking,
    )

    loaded = load_model(weights="float32")
    target = loaded.model
    start = time.perf_counter()
    int4 = quantized_copy(target, bits=4, group=32)
    quantize_seconds = time.perf_counter() - start
    int4_head8 = quantized_copy(target, bits=4, group=32, head_bits=8)
    int4_rerank4 = quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4)
    int8 = quantized_copy(target, bits=8, group=32)
    file_precision = load_model(weights="file").model
    head8 = ModelRunner(int4_head8)
    narrow = head8.narrow_kv_dtype()  # bfloat16 on the CPU kernels, as the drafter keeps it
    runners = {"fp32-target": (ModelRunner(target), None),
               "int4-copy": (ModelRunner(int4), narrow),
               "int4-copy-head8": (head8, narrow), "int4-copy-head8-f32kv": (head8, None),
               "int4-copy-rerank4": (ModelRunner(int4_rerank4), narrow),
               "int8-copy": (ModelRunner(int8), narrow),
               "gguf-file": (ModelRunner(file_precision), None)}
    order, _ = token_ranking(loaded.tokenizer, head8.vocab_size)
    for size in args.draft_vocab:
        restricted = restricted_head_copy(int4_head8, draft_vocabulary(order, size))
        runners[f"int4-copy-head8-vocab{size}"] = (ModelRunner(restricted), narrow)
    times: dict = {name: [] for name in runners}
    with torch.inference_mode():
        for name, (runner, kv) in runners.items():  # warm up
            one_token_ms(runner, args.prefix, 3, kv_dtype=kv)
        for _ in range(3):  # interleaved rounds, so drift hits both alike
            for name, (runner, kv) in runners.items():
                times[name] += one_token_ms(runner, args.prefix, args.repeats // 3, kv_dtype=kv)
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "prefix": args.prefix,
        "one_token_ms": {k: round(v, 3) for k, v in median.items()},
        "draft_over_target": {k: round(v / median["fp32-target"], 3) for k, v in median.items()},
        "isa": __import__("specdec_kernels").ops.cpu_isa(),
        "quantize_seconds": round(quantize_seconds, 2),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
