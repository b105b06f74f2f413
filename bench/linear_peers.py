"""The small-batch linear against what torch already offers on CPU, on one weight matrix.

    python3 -m bench.linear_peers --n 151936 --k 1536 --rows 1,2,5,8,16,32

Times ``x [M, K] @ W[N, K]^T`` (float32) for each M along three paths, interleaved M by M:
``torch.nn.functional.linear`` (MKL/oneDNN GEMM), oneDNN's pre-packed
``torch.ops.mkldnn._linear_pointwise`` (weight packed once, outside the timing) and
``specdec_kernels.ops.small_batch_linear``. Prints the median ms and the ratio to each path's
own M = 1, and whether each path is batch-invariant (row 0 bit-identical at every M).
Inductor's CPU GEMM template (``torch.compile(mode="max-autotune")``) is left out: it compiles
once per shape, and decoding's M changes every step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec_kernels import ops


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def paths(weight: torch.Tensor) -> dict:
    """name -> callable(x) computing x @ weight.T."""
    found = {"torch linear": lambda x: torch.nn.functional.linear(x, weight)}
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        found["oneDNN packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(
            x, packed, None, "none", [], ""
        )
    except (AttributeError, RuntimeError):  # not in this build of torch
        pass
    found["small_batch_linear"] = lambda x: ops.small_batch_linear(x, weight)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=151936, help="output features (rows of W)")
    parser.add_argument("--k", type=int, default=1536, help="input features")
    parser.add_argument("--rows", default="1,2,5,8,16,32")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(args.n, args.k, generator=gen) / args.k**0.5
    x_all = torch.randn(max(rows), args.k, generator=gen)
    found = paths(weight)
    ms = {name: {} for name in found}
    invariant = {name: True for name in found}
    first_row = {name: fn(x_all[:1])[0] for name, fn in found.items()}
    with torch.inference_mode():
        for m in rows:
            x = x_all[:m].contiguous()
            for name, fn in found.items():
                ms[name][m] = median_ms(lambda: fn(x), args.repeats)
                invariant[name] &= torch.equal(fn(x)[0], first_row[name])
    print(f"W [{args.n}, {args.k}] float32, {torch.get_num_threads()} threads; median ms "
          f"(ratio to the path's own M=1)")
    print("| M | " + " | ".join(found) + " |")
    print("|---:|" + "---:|" * len(found))
    for m in rows:
        cells = [f"{ms[n][m]:.2f} ({ms[n][m] / ms[n][rows[0]]:.2f}×)" for n in found]
        print(f"| {m} | " + " | ".join(cells) + " |")
    print("| batch-invariant | " + " | ".join("yes" if invariant[n] else "no" for n in found) + " |")


if __name__ == "__main__":
    main()
