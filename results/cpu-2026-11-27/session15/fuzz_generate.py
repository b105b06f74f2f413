"""generate() on a tiny random model with edge inputs, for every drafter that needs no asset:
exceptions other than ValueError/TypeError (a user's mistake, named) are findings; so are
outputs of the wrong length."""
import sys, traceback, itertools, signal
sys.path.insert(0, "/work/main")
import torch
from python_tests.decoding_helpers import tiny_model, random_heads, random_eagle
from specdec_kernels.decoding import generate, make_drafter
torch.manual_seed(0)
model = tiny_model(vocab=64, layers=3)
drafters = ["none", "prompt-lookup", "self-speculative", "lookahead", "jacobi", "quantized-self",
            "token-recycling", "suffix", "draft-model"]
prompts = {
    "empty list": [],
    "one empty prompt": [[]],
    "one token": [[5]],
    "ragged with empty": [[1, 2, 3], []],
    "repeats": [[7] * 40],
    "token >= vocab": [[1, 2, 99]],
    "negative token": [[1, -2, 3]],
    "ragged": [[1, 2, 3, 4, 5, 6, 7, 8, 9], [3], [4, 4, 4, 4, 4]],
    "tensor 2-D": torch.tensor([[1, 2, 3], [4, 5, 6]]),
    "long": [list(range(1, 60)) * 3],
}
kwargs_sets = {
    "greedy 8": dict(max_new_tokens=8),
    "0 tokens": dict(max_new_tokens=0),
    "1 token": dict(max_new_tokens=1),
    "ragged max": dict(max_new_tokens=[1, 5, 0]),
    "sampled": dict(max_new_tokens=8, temperature=0.8, top_k=5, top_p=0.9, seed=3),
    "temp -1": dict(max_new_tokens=4, temperature=-1.0),
    "top_p 0": dict(max_new_tokens=4, temperature=1.0, top_p=0.0),
    "top_k -3": dict(max_new_tokens=4, temperature=1.0, top_k=-3),
    "min_p 1": dict(max_new_tokens=4, temperature=1.0, min_p=1.0),
    "eos in prompt": dict(max_new_tokens=6, eos_token_id=5),
    "eos list": dict(max_new_tokens=6, eos_token_id=[1, 2, 3]),
    "nan temp": dict(max_new_tokens=4, temperature=float("nan")),
}
signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("hang")))
findings = []
refused = {}
for dname, (pname, prompt), (kname, kw) in itertools.product(drafters, prompts.items(), kwargs_sets.items()):
    try:
        d = None if dname == "none" else (make_drafter(dname, draft_model=tiny_model(vocab=64, layers=1, seed=2))
                                           if dname == "draft-model" else make_drafter(dname))
    except Exception as e:
        findings.append((dname, "make", repr(e)[:200])); continue
    signal.alarm(60)
    try:
        out = generate(model, prompt, drafter=d, chat_template=False, **kw)
        n = kw.get("max_new_tokens")
        rows = prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt
        caps = n if isinstance(n, list) else [n] * len(rows)
        for i, (toks, cap) in enumerate(zip(out.tokens, caps)):
            if len(toks) > cap or (len(toks) < cap and out.finish_reasons[i] == "length"):
                findings.append((dname, pname, kname, f"request {i}: {len(toks)} tokens for cap {cap} ({out.finish_reasons[i]})"))
            if any(t < 0 or t >= 64 for t in toks):
                findings.append((dname, pname, kname, f"token out of vocab {toks}"))
    except (ValueError, TypeError) as e:
        refused.setdefault((pname, kname), {})[dname] = str(e).splitlines()[0][:110]
    except Exception as e:
        findings.append((dname, pname, kname, f"{type(e).__name__}: {str(e)[:200]}"))
    finally:
        signal.alarm(0)
print(len(findings), "findings")
seen = set()
for f in findings:
    key = (f[0], f[-1][:80])
    if key in seen: continue
    seen.add(key); print(f)

print("refused (prompt, options): drafters")
for key, by in refused.items():
    msgs = set(by.values())
    print(key, "by", len(by), "of", len(drafters), "|", " || ".join(sorted(msgs))[:300])
