"""What the direct forward (:class:`~specdec_kernels.models.direct_forward.DirectForward`)
saves a decoding step against the model's own forward through the same kernels, interleaved
forward by forward on the default model at batch 1, for blocks of ``T`` tokens (1: plain
decoding; more: a chain to verify); and the direct forward with its layers in one
``ops.decoder_stack_`` call against its Python loop. All produce bit-identical logits (checked
here too).

    python3 -m bench.direct_forward --weights file --widths 1,4,16 --steps 21
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--weights", default="file", choices=["file", "float32"])
    parser.add_argument("--prefix", type=int, default=256)
    parser.add_argument("--widths", default="1,4,16")
    parser.add_argument("--steps", type=int, default=21)
    args = parser.parse_args(argv)

    from specdec_kernels import ops
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.models import load_model

    model = load_model(args.model, weights=args.weights).model
    arms = {"direct": ModelRunner(model, cpu_kernels=True),
            "direct, Python loop": ModelRunner(model, cpu_kernels=True),
            "model's forward": ModelRunner(model, cpu_kernels=True, direct_forward=False)}
    arms["direct, Python loop"]._direct_available().one_op = False
    widths = [int(w) for w in args.widths.split(",")]
    prompt = [[(i * 7919) % 1000 + 10 for i in range(args.prefix)]]
    caches = {name: r.new_cache(1, args.prefix + max(widths) + 1) for name, r in arms.items()}
    table = {}
    with torch.inference_mode():
        for name, runner in arms.items():
            runner.prefill(caches[name], prompt)
        for width in widths:
            tokens = torch.arange(11, 11 + width).unsqueeze(0)
            times = {name: [] for name in arms}
            logits = {}
            for rep in range(args.steps + 3):
                for name, runner in arms.items():
                    start = time.perf_counter()
                    logits[name] = runner.forward(caches[name], tokens, [args.prefix])
                    if rep >= 3:  # warm-up forwards are not timed
                        times[name].append((time.perf_counter() - start) * 1e3)
            first = logits["direct"]
            if not all(torch.equal(first, other) for other in logits.values()):
                raise AssertionError(f"T={width}: the forwards' logits differ")
            medians = {name: round(statistics.median(v), 2) for name, v in times.items()}
            medians["saved"] = round(1 - medians["direct"] / medians["model's forward"], 3)
            medians["one op / loop"] = round(medians["direct"] / medians["direct, Python loop"], 3)
            table[f"T={width}"] = medians
    result = {
        "date": time.strftime("%Y-%m-%d"), "isa": ops.cpu_isa(), "threads": torch.get_num_threads(),
        "weights": args.weights, "prefix": args.prefix, "steps": args.steps,
        "median_forward_ms": table,
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
