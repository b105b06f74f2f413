"""What routing the CPU linears costs a decoding step: the package's weight-subclass routing
(:class:`~specdec_kernels.decoding.cpu_matmul.RoutedLinears`, today's) against a
``TorchFunctionMode`` doing the same routing (the package's doorway until 2026-11-26, rebuilt
here for the comparison), interleaved step by step on the default model at batch 1.

    python3 -m bench.routing_overhead --weights file --steps 21
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from specdec_kernels import ops
from specdec_kernels.decoding.cpu_matmul import supports
from specdec_kernels.models.quantized_weight import QuantizedWeight


class _ModeRouting(TorchFunctionMode):
    """The former doorway: every torch call of the forward passes through Python."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if isinstance(weight, QuantizedWeight):
                return weight.linear(x, bias)
            if supports(x, weight, bias):
                return ops.small_batch_linear(x, weight, bias)
        return func(*args, **kwargs)


class _ModeFactory:
    def __call__(self, gemm_rows=None):
        return _ModeRouting()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--weights", default="file", choices=["file", "float32"])
    parser.add_argument("--prefix", type=int, default=256)
    parser.add_argument("--steps", type=int, default=21)
    args = parser.parse_args(argv)

    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.models import load_model

    # The model's own forward: the direct forward (models/direct_forward.py) calls the
    # kernels without either routing.
    runner = ModelRunner(load_model(args.model, weights=args.weights).model, cpu_kernels=True,
                         direct_forward=False)
    cache = runner.new_cache(1, args.prefix + 2 * (args.steps + 4) + 8)
    times = {"weight subclass": [], "torch function mode": []}
    with torch.inference_mode():
        runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(args.prefix)]])
        token = torch.tensor([[11]])

        def step(mode: bool) -> float:
            runner._routed = _ModeFactory() if mode else None  # None: the runner's own
            start = time.perf_counter()
            runner.forward(cache, token, list(cache.host_lens))
            cache.extend([1])
            return (time.perf_counter() - start) * 1e3

        for _ in range(3):
            step(False), step(True)
        for _ in range(args.steps):
            times["torch function mode"].append(step(True))
            times["weight subclass"].append(step(False))
    result = {
        "date": time.strftime("%Y-%m-%d"), "isa": ops.cpu_isa(), "threads": torch.get_num_threads(),
        "weights": args.weights, "prefix": args.prefix, "steps": args.steps,
        "median_step_ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
