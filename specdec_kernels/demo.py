"""A short tour: ``python -m specdec_kernels.demo``.

1. The KV-cache rollback op keeps a verification step's accepted rows (one launch, all
   layers), on a toy cache whose rows are numbered so the moves can be read.
2. Speculative decoding on the bundled default model (SmolLM2-135M-Instruct, offline; the
   first run converts its GGUF file once, ~20 s): prompt lookup against plain decoding on a
   summarization prompt, same output, with the statistics.
"""

from __future__ import annotations

import argparse
import time

import torch

import specdec_kernels
from specdec_kernels import ops


DEMO_QUESTION_ID = 275  # a summarization question (bundled, and in the shared dev set)


def kv_op_demo() -> None:
    print("== 1. KV-cache rollback: compact_kv_cache_")
    layers, batch, heads, capacity, head_dim = 2, 2, 1, 8, 1
    rows = torch.arange(capacity, dtype=torch.float32).view(1, 1, 1, capacity, 1)
    cache = rows.expand(layers, 2, batch, heads, capacity, head_dim).contiguous()
    lens = torch.tensor([2, 3])
    # Request 0 verified rows 2..6 and kept the path 2 -> 4 -> 5 (a tree branch);
    # request 1 verified rows 3..6 and kept 3, 4 (a chain, accepted up to a rejection).
    accept = torch.tensor([[2, 4, 5], [3, 4, -1]])
    counts = torch.tensor([3, 2])
    print(f"  before: request 0 rows {cache[0, 0, 0, 0, :, 0].tolist()}, lens {lens.tolist()}")
    ops.compact_kv_cache_(cache, lens, accept, counts)
    kept = f"{accept[0, :3].tolist()} of request 0 and {accept[1, :2].tolist()} of request 1"
    print(f"  keep rows {kept}")
    print(f"  after:  request 0 rows {cache[0, 0, 0, 0, :, 0].tolist()}, lens {lens.tolist()}")
    print(f"          request 1 rows {cache[0, 0, 1, 0, :, 0].tolist()} (all layers, K and V)")


def generation_demo(max_new_tokens: int) -> None:
    from specdec_kernels.data import load_prompts
    from specdec_kernels.decoding import PromptLookupDrafter, generate
    from specdec_kernels.models import load_default_model

    print("\n== 2. Speculative decoding on the default model (SmolLM2-135M-Instruct, fp32, CPU)")
    t0 = time.perf_counter()
    loaded = load_default_model()
    print(f"  loaded in {time.perf_counter() - t0:.1f}s")
    rows = [r for r in load_prompts() if r["category"] == "summarization"]
    row = next((r for r in rows if r["question_id"] == DEMO_QUESTION_ID), rows[0])
    prompt = row["turns"][0]
    print(f"  prompt (summarization, {len(prompt)} characters): {prompt[:100]!r}...")
    plain = generate(loaded, [prompt], max_new_tokens=max_new_tokens)
    fast = generate(loaded, [prompt], drafter=PromptLookupDrafter(), max_new_tokens=max_new_tokens)
    print(f"  output: {fast.text[0]!r}")
    print(f"  {plain.stats.summary()}")
    print(f"  {fast.stats.summary()}")
    same = "identical" if plain.tokens == fast.tokens else "DIFFERENT"
    speedup = fast.stats.tokens_per_second / max(plain.stats.tokens_per_second, 1e-9)
    print(f"  outputs {same}; prompt lookup ran at {speedup:.2f}x the plain loop's tokens/s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ops-only", action="store_true", help="skip the model part")
    args = parser.parse_args(argv)
    print(f"specdec_kernels {specdec_kernels.__version__}: {specdec_kernels.build_info()}")
    kv_op_demo()
    if not args.ops_only:
        generation_demo(args.max_new_tokens)


if __name__ == "__main__":
    main()
