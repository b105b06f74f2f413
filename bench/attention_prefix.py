"""What tree attention costs per layer at long prefixes on each CPU path, against the bytes of
K/V it reads: the default model's shape (9 query heads over 3 KV heads of 64), one request,
T = 1 and 8 query tokens, 30 distinct caches in turn so the loop streams them from memory as
a step does.

    python3 -m bench.attention_prefix
"""

from __future__ import annotations

import time

import torch

from specdec_kernels import ops

CACHES = 30  # one per layer of the default model


def _microseconds(call, repeats: int) -> float:
    for _ in range(5):
        call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    torch.manual_seed(0)
    for isa in ("avx512_bf16", "avx2"):
        if ops.cpu_isa(isa) != isa:
            continue
        for prefix in (256, 1024, 2048):
            for tokens in (1, 8):
                caches = [(torch.randn(1, 3, prefix + tokens, 64), torch.randn(1, 3, prefix + tokens, 64))
                          for _ in range(CACHES)]
                q = torch.randn(1, tokens, 9, 64)
                lens = torch.tensor([prefix])
                mask = ops.build_tree_masks(torch.arange(-1, tokens - 1).unsqueeze(0), lens).packed_mask
                turn = iter(range(10**9))

                def call():
                    k, v = caches[next(turn) % CACHES]
                    ops.tree_attention(q, k, v, lens, mask, 0.125)

                us = _microseconds(call, 300)
                megabytes = 2 * 3 * (prefix + tokens) * 64 * 4 / 1e6
                print(f"{isa:12s} prefix {prefix:5d} T={tokens}: {us:7.1f} us a layer, "
                      f"{megabytes / us * 1e3:5.1f} GB/s of K/V")
    ops.cpu_isa("none")


if __name__ == "__main__":
    main()
