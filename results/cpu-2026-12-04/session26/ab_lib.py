"""What the session's A/B scripts and probes share: the prompts ("short" or "notesN", never the
dev prompts) and the alternate-per-prompt loop."""
import json

from bench.tuning_prompts import tuning_prompts
from specdec_kernels import ops
from specdec_kernels.decoding import generate
from specdec_kernels.models import encode_prompts
from specdec_kernels.training.prompts import first_stage_prompts


def prompts_for(loaded, kind: str, count: int) -> list:
    """"short": the tuning prompts (seeds 301-303). "notesN": N of the target's greedy answers
    to 24 seed-311 requests as notes, then a summary or list request (N = 12: ~1.2k tokens)."""
    if kind == "short":
        return tuning_prompts(loaded, count=max(count // 3, 1))[:count]
    tok = loaded.tokenizer
    notes = int(kind.removeprefix("notes"))
    requests = first_stage_prompts(24, seed=311)
    answers = [tok.decode(generate(loaded, encode_prompts(tok, [r]), max_new_tokens=96).tokens[0],
                          skip_special_tokens=True) for r in requests]
    asks = ["Summarize the notes above in a few sentences.", "List the main topics of the notes above."]
    return encode_prompts(tok, ["Notes:\n\n" + "\n\n".join(answers[(i + j) % 24] for j in range(notes))
                                + "\n\n" + asks[i % 2] for i in range(count)])


def script_inputs(names: int, default_count: int):
    """A script's command line ``NAME.. [COUNT] [NEW]`` (``names`` leading words, the first
    WEIGHTS, the second PROMPTS): ``(words, count, new, loaded, prompts)`` with the default
    model at those weights, float32, and its prompts of that kind."""
    import sys

    import torch

    from specdec_kernels.models import load_default_model

    words = sys.argv[1 : names + 1]
    count = int(sys.argv[names + 1]) if len(sys.argv) > names + 1 else default_count
    new = int(sys.argv[names + 2]) if len(sys.argv) > names + 2 else 96
    loaded = load_default_model(dtype=torch.float32, weights=words[0])
    return words, count, new, loaded, prompts_for(loaded, words[1], count)


def alternate(prompts: list, runs: dict, new: int) -> dict:
    """``{name: [decode seconds, new tokens, target forwards]}`` of ``runs`` (``{name:
    run(prompt, max_new_tokens) -> GenerationOutput}``, the plain loop first), taking turns
    prompt by prompt after one short warm-up each; every output must equal the first run's."""
    for run in runs.values():
        run(prompts[0], 8)
    res = {name: [0.0, 0, 0] for name in runs}
    for p in prompts:
        ref = None
        for name, run in runs.items():
            o = run(p, new)
            res[name][0] += o.stats.decode_seconds
            res[name][1] += o.stats.new_tokens
            res[name][2] += o.stats.requests[0].target_forwards
            ref = o.tokens[0] if ref is None else ref
            assert o.tokens[0] == ref, name
    return res


def report(header: dict, prompts: list, new: int, res: dict, ratios: dict) -> None:
    """One JSON line: ``header``, the prompts, tokens/s and τ of each run, and ``ratios``
    (``{label: (run a, run b)}``: a's tokens/s over b's)."""
    speed = {m: n / s for m, (s, n, f) in res.items()}
    print(json.dumps({"isa": ops.cpu_isa(), **header, "count": len(prompts),
                      "prompt_tokens": [len(p) for p in prompts], "new_tokens": new,
                      **{m: {"decode tok/s": round(n / s, 1), "tau": round(n / f, 2)}
                         for m, (s, n, f) in res.items()},
                      **{label: round(speed[a] / speed[b], 3) for label, (a, b) in ratios.items()}}))
