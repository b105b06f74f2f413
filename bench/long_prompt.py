"""A long prompt and a short answer, the shape of RAG and summarization requests: prefill plus
N greedy tokens, the engine's plain loop against HF ``generate``, interleaved, on random
weights with real shapes (bench.cost_curve's models; no download, no EOS).

    python3 -m bench.long_prompt --models 135m,1.5b --prompt 800,2000 --new 64 [--isa avx2]

Prints, per model and prompt length, the median seconds of each path split into prefill and
decoding (the engine's own split; HF's prefill is timed as ``generate`` with one new token)
and the speedup of the engine over HF.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.cost_curve import MODEL_SHAPES, build_model
from specdec_kernels.bench import machine


def engine_seconds(model, prompt: list, new: int) -> tuple:
    """(total, prefill) seconds of the engine's plain loop."""
    from specdec_kernels.decoding import generate

    start = time.perf_counter()
    out = generate(model, [prompt], max_new_tokens=new, eos_token_id=[], chat_template=False)
    total = time.perf_counter() - start
    assert len(out.tokens[0]) == new
    return total, out.stats.prefill_seconds, out.stats.kernels


def hf_seconds(model, prompt: list, new: int) -> float:
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                   min_new_tokens=new, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="135m", help=f"comma list of {sorted(MODEL_SHAPES)}")
    parser.add_argument("--prompt", default="800", help="prompt lengths in tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--isa", choices=machine.ISA_CHOICES)
    args = parser.parse_args(argv)
    machine.cap_isa(args.isa)
    print(f"{machine.machine_line(machine.machine_info())}; {args.new} new tokens; median s")
    print("| model | prompt | ours: total (prefill) | HF generate: total (prefill) | speedup | kernels |")
    print("|---|---:|---:|---:|---:|---|")
    gen = torch.Generator().manual_seed(0)
    for name in args.models.split(","):
        model = build_model(name, "cpu", torch.float32)
        for length in [int(p) for p in args.prompt.split(",")]:
            prompt = torch.randint(model.config.vocab_size, (length,), generator=gen).tolist()
            ours, ours_prefill, theirs, theirs_prefill = [], [], [], []
            with torch.inference_mode():
                for _ in range(args.repeats):
                    total, prefill, kernels = engine_seconds(model, prompt, args.new)
                    ours.append(total)
                    ours_prefill.append(prefill)
                    theirs.append(hf_seconds(model, prompt, args.new))
                    theirs_prefill.append(hf_seconds(model, prompt, 1))
            o, t = statistics.median(ours), statistics.median(theirs)
            gemm = kernels.get("prefill_gemm_rows")
            print(f"| {name} | {length} | {o:.2f} ({statistics.median(ours_prefill):.2f}) | "
                  f"{t:.2f} ({statistics.median(theirs_prefill):.2f}) | {t / o:.2f}× | "
                  f"{kernels['path']}" + (f", prefill GEMM from {gemm} rows" if gemm else "")
                  + " |")
        del model


if __name__ == "__main__":
    main()
