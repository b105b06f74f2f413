"""Where one decoding step of the engine goes, at batch 1: a torch.profiler trace of N plain
steps (one token after a prefix in the cache) split into the quantized / float linears, the
tree attention, every other aten op, and the rest of the wall time (Python between the ops:
the Hugging Face module code and the engine's own).

    python3 -m bench.step_breakdown --weights file --prefix 256 --steps 20
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--weights", default="file", choices=["file", "float32"])
    parser.add_argument("--prefix", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)

    from specdec_kernels import ops
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.models import load_model

    model = load_model(args.model, weights=args.weights).model
    runner = ModelRunner(model)
    warm_up = 3
    # Rows for the warm-up, the profiled and the plain steps.
    cache = runner.new_cache(1, args.prefix + warm_up + 2 * args.steps + 8)
    with torch.inference_mode():
        runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(args.prefix)]])
        token = torch.tensor([[11]])

        def step():
            start = list(cache.host_lens)
            runner.forward(cache, token, start)
            cache.extend([1])

        for _ in range(warm_up):
            step()
        wall = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        wall = (time.perf_counter() - wall) / args.steps
    # Plain timing without the profiler's own overhead.
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        plain = (time.perf_counter() - start) / args.steps
    buckets = {"linear": 0.0, "attention": 0.0, "other aten ops": 0.0}
    for event in prof.key_averages():
        if event.key.startswith(("specdec::quantized_linear", "specdec::small_batch_linear")):
            buckets["linear"] += event.self_cpu_time_total
        elif event.key.startswith("specdec::tree_attention"):
            buckets["attention"] += event.self_cpu_time_total
        elif event.key.startswith("aten::") or event.key.startswith("specdec::"):
            buckets["other aten ops"] += event.self_cpu_time_total
    ms = {k: v / 1000 / args.steps for k, v in buckets.items()}
    ms["python and dispatch (rest of the profiled wall time)"] = wall * 1000 - sum(ms.values())
    result = {
        "date": time.strftime("%Y-%m-%d"), "isa": ops.cpu_isa(), "threads": torch.get_num_threads(),
        "weights": args.weights, "prefix": args.prefix,
        "step_ms_unprofiled": round(plain * 1000, 2), "step_ms_profiled": round(wall * 1000, 2),
        "breakdown_ms": {k: round(v, 2) for k, v in ms.items()},
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
