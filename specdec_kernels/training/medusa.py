"""``specdec train medusa``: Medusa-1 self-distillation of heads for a frozen target, on CPU.

1. Data (:func:`~specdec_kernels.training.selfdistill.build_data`, the cache ``specdec train
   eagle`` reads too): the target answers prompts made by this package (essays, then requests
   built around its own answers, then code, questions, translations and summaries), part
   greedy and part sampled; the hidden states behind every token are recorded by the engine's
   target-features doorway and cached once (``--data``, resumable chunk by chunk). Caches of
   the Medusa-only format that earlier versions wrote (final norm only) still train.
2. Training (:func:`train_heads`): head ``k`` learns, from the cached hidden state behind
   token ``t``, the target's own distribution of token ``t + 1 + k`` (its LM head on the
   cached hidden state that produced that token; ``--hard-labels``: the token itself), with
   cross-entropy weighted ``decay**k``; the target's layers never run again.
3. Evaluation: per-head top-1 .. top-K accuracy on a held-out split of the greedy answers
   (what greedy decoding will see), saved with the heads: the drafter derives its tree from it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["add_subcommand", "build_examples", "differentiable_head", "evaluate_heads",
           "train_heads"]


# ---------------------------------------------------------------------------- training


def build_examples(records: list, num_heads: int) -> dict:
    """Training rows from cached records.

    Returns
    -------
    dict
        ``features`` ``[R, H]`` float16 (every cached row); ``rows`` ``[M]`` the examples'
        rows (the hidden state behind token ``t``); ``targets`` ``[M, N]`` the token
        ``t + 1 + k`` head ``k`` must guess (``-1`` past the end); ``teachers`` ``[M, N]`` the
        row whose LM-head distribution is the target's own distribution of that token
        (``-1`` past the end).
    """
    feats, rows, targets, teachers = [], [], [], []
    offset = 0
    for r in records:
        tokens = torch.tensor(r["tokens"], dtype=torch.int64)
        n = len(tokens)
        feats.append(r["features"])
        target = torch.full((n, num_heads), -1, dtype=torch.int64)
        teacher = torch.full((n, num_heads), -1, dtype=torch.int64)
        for k in range(num_heads):
            if k + 1 < n:
                target[: n - 1 - k, k] = tokens[k + 1 :]
                teacher[: n - 1 - k, k] = offset + torch.arange(k + 1, n)
        keep = target[:, 0] >= 0
        rows.append(offset + torch.arange(n)[keep])
        targets.append(target[keep])
        teachers.append(teacher[keep])
        offset += n
    return {"features": torch.cat(feats), "rows": torch.cat(rows),
            "targets": torch.cat(targets), "teachers": torch.cat(teachers)}


def split_records(records: list, held_out: float, seed: int):
    """(train, held-out): the held-out part is a share of the greedy answers (what greedy
    decoding sees); every sampled answer trains."""
    greedy = [i for i, r in enumerate(records) if not r["sampled"]]
    random.Random(seed).shuffle(greedy)
    test = set(greedy[: max(1, int(round(held_out * len(greedy))))])
    return ([r for i, r in enumerate(records) if i not in test],
            [r for i, r in enumerate(records) if i in test])


def draft_vocabulary(targets: Tensor, size: int, vocab: int) -> Tensor:
    """The ``size`` most frequent target tokens (ties: lower id), sorted by id."""
    counts = torch.bincount(targets[targets >= 0], minlength=vocab)
    size = min(size, int((counts > 0).sum()))
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))[:size]
    return torch.tensor(sorted(order), dtype=torch.int64)


def _as_columns(heads, targets: Tensor) -> Tensor:
    """Target ids as columns of the heads' logits (``-100``: unreachable or past the end)."""
    if heads.draft_ids is None:
        return torch.where(targets >= 0, targets, torch.full_like(targets, -100))
    table = torch.full((heads.vocab_size,), -100, dtype=torch.int64)
    table[heads.draft_ids] = torch.arange(heads.draft_ids.numel())
    return torch.where(targets >= 0, table[targets.clamp(min=0)], torch.full_like(targets, -100))


@torch.no_grad()
def evaluate_heads(heads, examples: dict, lm_head=None, top: int = 10,
                   batch: int = 2048) -> list:
    """``[N][top]`` rank accuracy on ``examples`` (:func:`build_examples`): the share of rows
    (with a target) where head ``k``'s rank-``r`` guess is the token."""
    heads.eval()
    features = examples["features"][examples["rows"]]
    targets = examples["targets"]
    n = heads.num_heads
    hits = torch.zeros(n, top, dtype=torch.float64)
    rows = (targets >= 0).sum(0).double()
    for i in range(0, len(features), batch):
        logits = heads(features[i : i + batch].float(), lm_head)
        ids = logits.topk(top, -1).indices
        if heads.draft_ids is not None:
            ids = heads.draft_ids[ids]
        t = targets[i : i + batch]
        hits += ((ids == t[..., None]) & (t[..., None] >= 0)).sum(0).double()
    return (hits / rows.clamp(min=1)[:, None]).tolist()


def train_heads(heads, examples: dict, *, epochs: int, lr: float, teacher_weight: Tensor,
                batch_size: int = 32, decay: float = 0.8, weight_decay: float = 0.0,
                soft: bool = True, lm_head=None, seed: int = 0, log=print,
                eval_set=None) -> list:
    """Train every head on its token, loss weighted ``decay**k``; AdamW, cosine schedule.

    With ``soft`` (self-distillation proper), head ``k``'s target is the frozen target's own
    distribution of its token (its LM head, rows ``teacher_weight``, on the cached hidden
    state that produced the token) rather than the one token drawn: far more signal per
    cached row. Keeps the epoch with the best held-out top-1 (summed over heads) when
    ``eval_set`` is given. Returns the per-epoch history.
    """
    torch.manual_seed(seed)
    features, rows = examples["features"], examples["rows"]
    teachers = examples["teachers"]
    columns = _as_columns(heads, examples["targets"])
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(rows) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / max(steps, 1), 1.0)))
    )
    weights = [decay**k for k in range(heads.num_heads)]
    history, best = [], (-1.0, None)
    for epoch in range(epochs):
        heads.train()
        order = torch.randperm(len(rows))
        total, count, t0 = 0.0, 0, time.perf_counter()
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            logits = heads(features[rows[idx]].float(), lm_head)  # [b, N, V']
            loss = 0.0
            for k in range(heads.num_heads):
                valid = columns[idx, k] != -100 if not soft else teachers[idx, k] >= 0
                if not bool(valid.any()):
                    continue
                if soft:
                    with torch.no_grad():
                        teacher = features[teachers[idx[valid], k]].float() @ teacher_weight.T
                        p = torch.softmax(teacher, -1)
                    logp = torch.log_softmax(logits[valid, k], -1)
                    head_loss = -(p * logp).sum(-1).mean()
                else:
                    head_loss = torch.nn.functional.cross_entropy(
                        logits[valid, k], columns[idx[valid], k]
                    )
                loss = loss + weights[k] * head_loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        entry = {"epoch": epoch + 1, "loss": total / max(count, 1),
                 "seconds": round(time.perf_counter() - t0, 1)}
        if eval_set is not None:
            acc = evaluate_heads(heads, eval_set, lm_head=lm_head, top=1)
            entry["held_out_top1"] = [round(a[0], 4) for a in acc]
            score = sum(a[0] for a in acc)
            if score > best[0]:
                best = (score, {k: v.detach().clone() for k, v in heads.state_dict().items()})
        history.append(entry)
        log(json.dumps(entry))
    if best[1] is not None:
        heads.load_state_dict(best[1])
    heads.eval()
    return history


def differentiable_head(lm_head: nn.Module) -> nn.Module:
    """The LM head the heads train through: ``lm_head`` itself, or for a head held at a GGUF
    file's precision a float32 copy of it. The quantized kernel has no gradient for its input
    (its activations are rounded to int8), so training through it would leave every head's
    blocks with no gradient at all: a run that trains nothing, silently."""
    from specdec_kernels.models.quantized_weight import QuantizedWeight

    weight = lm_head.weight
    if not isinstance(weight, QuantizedWeight):
        return lm_head
    dense = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    dense.weight = nn.Parameter(weight.dequantize().float(), requires_grad=False)
    return dense


def run_training(args, log=print) -> Path:
    from specdec_kernels.training.medusa_data import load_cache
    from specdec_kernels.medusa.heads import MedusaHeads
    from specdec_kernels.models import load_model
    from specdec_kernels.training.selfdistill import DataCache, is_feature_cache

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    data = Path(args.data)
    if is_feature_cache(data):  # the shared self-distillation cache (specdec train eagle's)
        records = DataCache.load(data).medusa_records()
    else:
        records = load_cache(data / "first") + load_cache(data / "second")
    if not records:
        raise SystemExit(f"no cached data under {data} (run the data phase first)")
    train, test = split_records(records, args.held_out, args.seed)
    train_set = build_examples(train, args.heads)
    test_set = build_examples(test, args.heads)
    y_train, y_test = train_set["targets"], test_set["targets"]
    loaded = load_model(args.model)
    model = loaded.model
    lm_head = model.get_output_embeddings()
    for p in model.parameters():
        p.requires_grad_(False)
    hidden, vocab = int(model.config.hidden_size), int(lm_head.weight.shape[0])
    draft_ids = None
    if args.draft_vocab:
        draft_ids = draft_vocabulary(y_train[:, 0], args.draft_vocab, vocab)
    own = args.projection == "own"
    heads = MedusaHeads(hidden, vocab, args.heads, args.layers, draft_ids=draft_ids,
                        own_projection=own)
    heads.init_projections_from(lm_head.weight.detach().float())
    shared = None if own else differentiable_head(lm_head)
    coverage = None
    if draft_ids is not None:
        inside = torch.zeros(vocab, dtype=torch.bool)
        inside[draft_ids] = True
        coverage = float(inside[y_test[:, 0]].double().mean())
    tokens = sum(len(r["tokens"]) for r in records)
    log(f"{len(records)} answers ({sum(r['sampled'] for r in records)} sampled), {tokens} "
        f"tokens; train rows {len(y_train)}, held-out rows {len(y_test)}; draft vocabulary "
        f"{args.draft_vocab or 'none'} (held-out coverage {coverage})")
    teacher_weight = lm_head.weight.detach().float()
    if draft_ids is not None:
        teacher_weight = teacher_weight[draft_ids].contiguous()
    history = train_heads(
        heads, train_set, epochs=args.epochs, lr=args.lr, teacher_weight=teacher_weight,
        batch_size=args.batch, decay=args.decay, weight_decay=args.weight_decay,
        soft=not args.hard_labels, lm_head=shared, seed=args.seed, log=log, eval_set=test_set,
    )
    accuracy = evaluate_heads(heads, test_set, lm_head=shared, top=args.top)
    manifest = {}
    if (data / "manifest.json").is_file():
        manifest = json.loads((data / "manifest.json").read_text())
    heads.info = {
        "target": args.model,
        "rank_accuracy": [[round(a, 5) for a in row] for row in accuracy],
        "top1": [round(row[0], 4) for row in accuracy],
        "top5": [round(sum(row[:5]), 4) for row in accuracy],
        "held_out_rows": len(y_test),
        "draft_vocab_coverage": coverage,
        "data": {"answers": len(records), "tokens": tokens, "train_rows": len(y_train),
                 **{k: manifest[k] for k in manifest if k not in ("seconds_this_run", "chunks")}},
        "training": {"projection": args.projection, "soft_targets": not args.hard_labels,
                     "epochs": args.epochs, "lr": args.lr, "batch": args.batch,
                     "decay": args.decay, "weight_decay": args.weight_decay,
                     "history": history, "seconds": round(time.perf_counter() - t0)},
        "command": " ".join(["specdec", "train", "medusa"] + sys.argv[3:])
        if sys.argv[1:3] == ["train", "medusa"] else " ".join(sys.argv),
    }
    heads.save(args.out)
    (Path(args.out) / "README.md").write_text(describe_heads(heads))
    for k, row in enumerate(accuracy):
        log(f"head {k}: top-1 {row[0]:.3f}, top-5 {sum(row[:5]):.3f}")
    log(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return Path(args.out)


def describe_heads(heads) -> str:
    """A Markdown note of how the heads were made and how good they are (written beside
    them)."""
    info = heads.info
    data, training = info.get("data", {}), info.get("training", {})
    lines = [
        f"# Medusa heads for `{info.get('target')}`",
        "",
        f"{heads.num_heads} heads x {heads.num_layers} residual block(s), projection: "
        f"{heads.projection} (draft vocabulary: {heads.output_size} tokens, held-out "
        f"coverage {info.get('draft_vocab_coverage')}).",
        "",
        f"Made by `{info.get('command')}` ({training.get('seconds')} s of training on the "
        f"cache; data: {data.get('answers')} answers of the frozen target, "
        f"{data.get('tokens')} tokens, {data.get('train_rows')} training rows, "
        f"{info.get('held_out_rows')} held-out rows from greedy answers).",
        "",
        "Data: " + ", ".join(f"{k} {v}" for k, v in data.items()) + ".",
        "",
        "| head (guesses token t+k+2) | top-1 | top-5 |",
        "|---:|---:|---:|",
    ]
    for k, (t1, t5) in enumerate(zip(info.get("top1", []), info.get("top5", []))):
        lines.append(f"| {k} | {t1:.3f} | {t5:.3f} |")
    lines += ["", "Training history (loss, held-out top-1 per head):", ""]
    for entry in training.get("history", []):
        lines.append(f"- epoch {entry['epoch']}: loss {entry['loss']:.3f}, top-1 "
                     f"{entry.get('held_out_top1')}, {entry['seconds']} s")
    return "\n".join(lines) + "\n"


def add_train_arguments(p) -> None:
    p.add_argument("--out", required=True, help="folder for the heads")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=1, help="residual blocks per head")
    p.add_argument("--draft-vocab", type=int, default=4096,
                   help="heads guess only the N most frequent training tokens (0: all)")
    p.add_argument("--projection", choices=["shared", "own"], default="shared",
                   help="the target's frozen LM head (rows), or each head's own (trained)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hard-labels", action="store_true",
                   help="train on the drawn tokens, not the target's distributions")
    p.add_argument("--decay", type=float, default=0.8, help="loss weight decay**k of head k")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--held-out", type=float, default=0.1, help="share of greedy answers")
    p.add_argument("--top", type=int, default=10, help="ranks of the saved accuracies")


def main(argv=None) -> int:
    from specdec_kernels.training.arguments import add_data_arguments
    from specdec_kernels.training.selfdistill import build_data

    parser = argparse.ArgumentParser(prog="python3 -m specdec_kernels.training.medusa")
    sub = parser.add_subparsers(dest="phase", required=True)
    add_data_arguments(sub.add_parser("data", help="generate and cache the data only"))
    p = sub.add_parser("heads", help="train heads on the cached data only")
    add_data_arguments(p)
    add_train_arguments(p)
    args = parser.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.phase == "data":
        build_data(args, log=log)
    else:
        run_training(args, log=log)
    return 0


def add_subcommand(subparsers) -> None:
    """Register ``specdec train medusa`` (data, then training; resumes cached data)."""
    from specdec_kernels.training.arguments import add_data_arguments

    train = subparsers.add_parser("train", help="train drafters for a target")
    kinds = train.add_subparsers(dest="kind", required=True)
    p = kinds.add_parser(
        "medusa", help="Medusa-1 heads by self-distillation (data + training)",
        description=__doc__,
    )
    add_data_arguments(p)
    add_train_arguments(p)
    p.add_argument("--skip-data", action="store_true", help="train on the cache as it is")
    p.set_defaults(func=_run_subcommand)
    from specdec_kernels.training.eagle import add_subcommand as add_eagle

    add_eagle(kinds)


def _run_subcommand(args) -> int:
    from specdec_kernels.training.selfdistill import build_data

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if not args.skip_data:
        build_data(args, log=log)
    run_training(args, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
