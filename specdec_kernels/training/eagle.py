"""``specdec train eagle``: an EAGLE-3 draft for a frozen target, trained on the cached
self-distillation data (:mod:`~specdec_kernels.training.selfdistill`) on CPU.

Training-time test (EAGLE-3): the draft is unrolled ``--steps`` times over every sequence.
Step 0 reads the target's fused low/middle/high features; step ``k`` reads, at position ``t``,
the draft's own output of step ``k - 1`` at ``t - 1`` (what it will feed on when drafting
``k`` tokens ahead), with the data's next token embedded. Its attention sees what drafting
will see: step-0 keys up to ``t - k`` (the committed prefix) and, of every step ``j <= k``, the
one key on its own chain (position ``t - k + j``). Every step learns the target's own
distribution of the token two ahead (its LM head on the cached final-norm state, restricted to
the draft vocabulary), loss weighted ``decay**k``, on answer tokens only.

The draft vocabulary is the ``--draft-vocab`` most frequent answer tokens. The network starts
from the target: its LM head rows and final norm, ``fc`` passing the high layer through, and
the decoder layer's hidden half copied from the target's last layer. Training runs in pieces
(``--time-budget``) that save and resume their state (``state.pt``: tensors and numbers only,
read with ``weights_only``), each piece under the heavy-job lock.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from specdec_kernels.eagle.model import EagleConfig, EagleDraftModel, save_eagle
if TYPE_CHECKING:  # the data module decodes with the target: imported when a command runs
    from specdec_kernels.training.selfdistill import DataCache

__all__ = ["add_subcommand", "draft_vocabulary", "evaluate", "ttt_loss"]


def draft_vocabulary(cache: DataCache, sequences: list, size: int, vocab: int) -> Tensor:
    """The ``size`` most frequent answer tokens of ``sequences`` (ties: lower id), ascending."""
    counts = torch.zeros(vocab, dtype=torch.int64)
    for i in sequences:
        start = int(cache.offsets[i]) + int(cache.prompt_lens[i])
        counts += torch.bincount(cache.tokens[start : int(cache.offsets[i + 1])], minlength=vocab)
    size = min(size, int((counts > 0).sum()))
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))[:size]
    return torch.tensor(sorted(order), dtype=torch.int64)


def init_from_target(draft: EagleDraftModel, target) -> None:
    """Start from the target: LM head rows of the draft vocabulary, final norm, ``fc`` passing
    the high layer through, the layer's hidden half from the target's last layer."""
    c = draft.config
    h = c.hidden_size
    decoder = target.get_decoder()
    last = decoder.layers[-1]
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[draft.draft_ids])
        draft.norm.weight.copy_(decoder.norm.weight)
        draft.fc.weight[:, 2 * h :] += torch.eye(h)
        mid, attn = draft.midlayer, last.self_attn
        mid.hidden_norm.weight.copy_(last.input_layernorm.weight)
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(mid.self_attn, name).weight[:, h:].copy_(getattr(attn, name).weight)
        mid.self_attn.o_proj.weight.copy_(attn.o_proj.weight)
        mid.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mid.mlp, name).weight.copy_(getattr(last.mlp, name).weight)


# ---------------------------------------------------------------------------- batches


def batches(cache: DataCache, sequences: list, tokens_per_batch: int, max_len: int,
            seed: int) -> list:
    """Sequences grouped by length into batches of about ``tokens_per_batch`` padded tokens,
    in a seeded random order: ``[(sequence ids), ...]``."""
    lens = {i: min(int(cache.offsets[i + 1] - cache.offsets[i]), max_len) for i in sequences}
    order = sorted(sequences, key=lambda i: (lens[i], i))
    out, current = [], []
    for i in order:
        if current and (len(current) + 1) * lens[i] > tokens_per_batch:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    random.Random(seed).shuffle(out)
    return out


def make_batch(cache: DataCache, ids: list, max_len: int, hidden: int, teacher: Tensor):
    """Padded tensors of sequences ``ids``: fused-layer features ``[B, N, 3H]``, tokens
    ``[B, N]``, the teacher distribution of the token two ahead ``[B, N, Vd]`` and where the
    loss applies ``[B, N]`` (an answer token two ahead exists)."""
    lens = [min(int(cache.offsets[i + 1] - cache.offsets[i]), max_len) for i in ids]
    n = max(lens)
    b = len(ids)
    feats = torch.zeros(b, n, 3 * hidden, dtype=torch.bfloat16)
    final = torch.zeros(b, n, hidden, dtype=torch.bfloat16)
    tokens = torch.zeros(b, n, dtype=torch.int64)
    loss_at = torch.zeros(b, n, dtype=torch.bool)
    for row, (i, length) in enumerate(zip(ids, lens)):
        start = int(cache.offsets[i])
        feats[row, :length] = cache.features[start : start + length, : 3 * hidden]
        final[row, :length] = cache.features[start : start + length, 3 * hidden : 4 * hidden]
        tokens[row, :length] = cache.tokens[start : start + length]
        # Position t predicts token t + 2, which must be an answer token inside the window.
        first = max(int(cache.prompt_lens[i]) - 2, 0)
        loss_at[row, first : length - 2] = True
    # Teacher of position t: the target's distribution of token t + 2 (final norm of t + 1).
    with torch.no_grad():
        logits = final[:, 1:].float() @ teacher.T
        target = torch.softmax(logits, -1)
        target = torch.cat([target, target.new_zeros(b, 1, target.shape[-1])], 1)
    return feats, tokens, target, loss_at


# ---------------------------------------------------------------------------- the unrolled loss


def _shift(x: Tensor, by: int, dim: int = 1) -> Tensor:
    """``x`` moved ``by`` places to later positions along ``dim`` (zeros enter)."""
    if by == 0:
        return x
    pad = [0, 0] * (x.dim() - dim - 1) + [by, 0]
    return nn.functional.pad(x, pad).narrow(dim, 0, x.shape[dim])


def ttt_forward(draft: EagleDraftModel, feats: Tensor, tokens: Tensor, steps: int) -> list:
    """Draft logits ``[B, N, Vd]`` of every unrolled step (see the module notes)."""
    c = draft.config
    b, n = tokens.shape
    next_tokens = torch.cat([tokens[:, 1:], tokens.new_zeros(b, 1)], 1)
    positions = torch.arange(n).expand(b, n)
    group = c.num_heads // c.num_kv_heads
    scale = 1.0 / math.sqrt(c.head_dim)
    hidden = draft.fuse(feats.float())
    keys, values, outputs = [], [], []
    t = torch.arange(n)
    for k in range(steps):
        if k:
            hidden = _shift(outputs[-1], 1)
        q, key, value, residual = draft.project(hidden, next_tokens, positions)
        key = key.repeat_interleave(group, 1)
        value = value.repeat_interleave(group, 1)
        keys.append(key)
        values.append(value)
        # Step-0 keys up to t - k, then the one key of each step j <= k on this chain.
        causal = (t[None, :] <= t[:, None] - k)
        scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
        for j in range(1, k + 1):
            scores.append(((q * _shift(keys[j], k - j, 2)).sum(-1) * scale)[..., None])
        if k == 0:
            scores.append(torch.full_like(scores[0][..., :1], float("-inf")))
        weights = torch.softmax(torch.cat(scores, -1), -1)
        attended = weights[..., :n] @ values[0]
        for j in range(1, k + 1):
            attended = attended + weights[..., n + j - 1 : n + j] * _shift(values[j], k - j, 2)
        outputs.append(draft.finish(residual, attended))
    return [draft.logits(o) for o in outputs]


def ttt_loss(draft, feats, tokens, target, loss_at, steps: int, decay: float):
    """Weighted soft cross-entropy of every step and its top-1 agreement with the teacher.

    Step ``k`` at position ``t`` has a chain rooted at ``t - k``, which must exist."""
    logits = ttt_forward(draft, feats, tokens, steps)
    total, hits = 0.0, []
    t = torch.arange(tokens.shape[1])
    best = target.argmax(-1)
    for k, step_logits in enumerate(logits):
        at = loss_at & (t >= k)[None]
        if not bool(at.any()):
            hits.append((0, 0))
            continue
        logp = torch.log_softmax(step_logits[at].float(), -1)
        total = total + decay**k * -(target[at] * logp).sum(-1).mean()
        hits.append((int((step_logits[at].argmax(-1) == best[at]).sum()), int(at.sum())))
    return total, hits


@torch.no_grad()
def evaluate(draft, cache, sequences, args, teacher, hidden) -> list:
    """Top-1 agreement with the target's argmax per unrolled step on ``sequences``."""
    draft.eval()
    totals = [[0, 0] for _ in range(args.steps)]
    for ids in batches(cache, sequences, args.tokens_per_batch, args.max_len, 0):
        batch = make_batch(cache, ids, args.max_len, hidden, teacher)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            _, hits = ttt_loss(draft, *batch, args.steps, args.decay)
        for k, (h, n) in enumerate(hits):
            totals[k][0] += h
            totals[k][1] += n
    draft.train()
    return [round(h / max(n, 1), 4) for h, n in totals]


# ---------------------------------------------------------------------------- the run


def run_training(args, log=print) -> Path:
    from specdec_kernels.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    work = Path(args.work or (Path(args.data) / "eagle-train"))
    work.mkdir(parents=True, exist_ok=True)
    from specdec_kernels.training.selfdistill import DataCache

    cache = DataCache.load(args.data)
    loaded = load_model(args.model)
    target = loaded.model
    config = target.config
    hidden, vocab = int(config.hidden_size), int(config.vocab_size)
    capture = tuple(int(p) for p in cache.layers[:3])
    if str(cache.layers[3]) != "final_norm":
        raise ValueError(f"the cache's fourth capture point is {cache.layers[3]}, not final_norm")
    train, test = cache.split(args.held_out, args.seed)
    state_path = work / "state.pt"
    resumed = state_path.is_file()
    if resumed:
        state = torch.load(state_path, weights_only=True)
        draft_ids = state["draft_ids"]
    else:
        draft_ids = draft_vocabulary(cache, train, args.draft_vocab, vocab)
    draft = EagleDraftModel(EagleConfig.for_target(config, len(draft_ids), capture), draft_ids)
    draft.bind_target(target)
    teacher = target.get_output_embeddings().weight.detach()[draft_ids].float()
    params = list(draft.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    plan = [b for e in range(args.epochs)
            for b in batches(cache, train, args.tokens_per_batch, args.max_len, args.seed + e)]
    total_steps = len(plan)
    warmup = max(1, int(0.03 * total_steps))
    def schedule(s: int) -> float:  # linear warm-up, then cosine decay
        return min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * s / total_steps)))

    if resumed:
        draft.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        done, seconds = int(state["done"]), float(state["seconds"])
        history = json.loads(state["history"])
    else:
        init_from_target(draft, target)
        done, history, seconds = 0, [], 0.0
    for p in target.parameters():
        p.requires_grad_(False)
    log(f"{cache.num_sequences} sequences ({cache.answer_tokens()} answer tokens); train "
        f"{len(train)}, held out {len(test)}; draft vocabulary {len(draft_ids)}; "
        f"{total_steps} batches planned, {done} done")
    draft.train()
    piece_start = time.perf_counter()
    rows, loss_sum = 0, 0.0
    while done < total_steps:
        if args.time_budget and time.perf_counter() - piece_start > args.time_budget:
            break
        for group in opt.param_groups:
            group["lr"] = args.lr * schedule(done)
        feats, tokens, target_p, loss_at = make_batch(cache, plan[done], args.max_len, hidden,
                                                      teacher)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss, hits = ttt_loss(draft, feats, tokens, target_p, loss_at, args.steps, args.decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done += 1
        rows += int(loss_at.sum())
        loss_sum += float(loss.detach())
        if done % args.log_every == 0:
            elapsed = time.perf_counter() - piece_start
            log(f"batch {done}/{total_steps}: loss {loss_sum / args.log_every:.3f}, step top-1 "
                f"{[round(h / max(n, 1), 3) for h, n in hits]}, {rows / elapsed:.0f} rows/s")
            loss_sum = 0.0
    piece_seconds = time.perf_counter() - piece_start
    seconds += piece_seconds
    history.append({"batches_done": done, "piece_seconds": round(piece_seconds, 1),
                    "rows_per_second": round(rows / max(piece_seconds, 1e-9), 1)})
    torch.save({"model": draft.state_dict(),
                "optimizer": opt.state_dict(), "draft_ids": draft_ids, "done": done,
                "history": json.dumps(history), "seconds": seconds}, state_path)
    if done < total_steps:
        log(f"piece done ({done}/{total_steps} batches); run again to resume")
        return work
    accuracy = evaluate(draft, cache, test, args, teacher, hidden)
    manifest = {}
    if (Path(args.data) / "manifest.json").is_file():
        manifest = json.loads((Path(args.data) / "manifest.json").read_text())
    generation = manifest.get("chunks", {})
    gen_tokens = sum(c["new_tokens"] for c in generation.values())
    gen_seconds = sum(c["seconds"] for c in generation.values())
    draft.config.info = {
        "target": args.model,
        "target_layers": int(config.num_hidden_layers),
        "held_out_top1_per_step": accuracy,
        "data": {"sequences": cache.num_sequences, "answer_tokens": cache.answer_tokens(),
                 "train_sequences": len(train), "held_out_sequences": len(test),
                 "generation_tokens": gen_tokens, "generation_seconds": round(gen_seconds),
                 "generation_tokens_per_second": round(gen_tokens / max(gen_seconds, 1e-9), 1),
                 "chunks_used": len(generation),
                 **{k: manifest[k] for k in manifest if k not in ("chunks",)}},
        "training": {"epochs": args.epochs, "steps": args.steps, "lr": args.lr,
                     "tokens_per_batch": args.tokens_per_batch, "max_len": args.max_len,
                     "decay": args.decay, "bf16": args.bf16, "batches": total_steps,
                     "seconds": round(seconds), "pieces": history},
        "command": " ".join(["specdec", "train", "eagle"] + sys.argv[3:])
        if sys.argv[1:3] == ["train", "eagle"] else " ".join(sys.argv),
    }
    save_eagle(draft, args.out)
    (Path(args.out) / "README.md").write_text(describe(draft.config))
    log(f"held-out top-1 per step {accuracy}; wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return Path(args.out)


def describe(config: EagleConfig) -> str:
    """A Markdown note of how the drafter was made (written beside it)."""
    info = config.info
    data, training = info.get("data", {}), info.get("training", {})
    lines = [
        f"# EAGLE-3 drafter for `{info.get('target')}`",
        "",
        f"One decoder layer of the target's shape (hidden {config.hidden_size}, "
        f"{config.num_heads} heads / {config.num_kv_heads} KV heads, MLP "
        f"{config.intermediate_size}), fusing target layers {list(config.capture_layers)}; "
        f"draft vocabulary of {config.draft_vocab_size} tokens. Published EAGLE-3 layout "
        "(`config.json`, `model.safetensors` with `d2t`/`t2d`), weights in bfloat16.",
        "",
        f"Made by `{info.get('command')}`.",
        "",
        "Data (not committed; made in resumable chunks by "
        f"`python3 -m specdec_kernels.training.selfdistill --data DATA --first-prompts "
        f"{data.get('first_prompts')} --second-prompts {data.get('second_prompts')} "
        f"--task-prompts {data.get('task_prompts', 0)} "
        f"--self-prompts {data.get('self_prompts', 0)} "
        f"--max-new-tokens {data.get('max_new_tokens')} --batch-size {data.get('batch_size')} "
        f"--sampled-fraction {data.get('sampled_fraction')}`, "
        f"{data.get('chunks_used')} chunks): "
        f"{data.get('sequences')} answers of the frozen target ({data.get('answer_tokens')} "
        f"answer tokens; {data.get('train_sequences')} train / {data.get('held_out_sequences')}"
        f" held-out sequences), generated at {data.get('generation_tokens_per_second')} "
        f"tokens/s ({data.get('generation_seconds')} s of generation).",
        "",
        f"Training: {training.get('epochs')} epoch(s), {training.get('steps')} unrolled steps, "
        f"{training.get('batches')} batches, {training.get('seconds')} s in "
        f"{len(training.get('pieces', []))} piece(s): "
        + ", ".join(f"{p['rows_per_second']} rows/s" for p in training.get("pieces", [])) + ".",
        "",
        f"Held-out top-1 agreement with the target per unrolled step: "
        f"{info.get('held_out_top1_per_step')}.",
    ]
    return "\n".join(lines) + "\n"


def add_train_arguments(p) -> None:
    p.add_argument("--out", required=True, help="folder for the drafter")
    p.add_argument("--work",
                   help="folder of the resumable training state (default DATA/eagle-train)")
    p.add_argument("--draft-vocab", type=int, default=4096,
                   help="draft head over the N most frequent answer tokens")
    p.add_argument("--steps", type=int, default=3, help="unrolled training-time-test steps")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--decay", type=float, default=0.8, help="loss weight decay**k of step k")
    p.add_argument("--tokens-per-batch", type=int, default=4096)
    p.add_argument("--max-len", type=int, default=768, help="sequences cut to this many tokens")
    p.add_argument("--held-out", type=float, default=0.05, help="share of greedy answers")
    p.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="float32 matmuls instead of bfloat16 autocast")
    p.add_argument("--log-every", type=int, default=20)


def main(argv=None) -> int:
    from specdec_kernels.training.selfdistill import add_data_arguments, build_data

    parser = argparse.ArgumentParser(prog="python3 -m specdec_kernels.training.eagle",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser)
    add_train_arguments(parser)
    parser.add_argument("--skip-data", action="store_true", help="train on the cache as it is")
    args = parser.parse_args(argv)
    return _run(args)


def _run(args) -> int:
    from specdec_kernels.training.selfdistill import build_data

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if not args.skip_data:
        build_data(args, log=log)
    run_training(args, log=log)
    return 0


def add_subcommand(subparsers) -> None:
    """Register ``specdec train eagle`` under the ``train`` command (data, then training;
    both resume)."""
    from specdec_kernels.training.arguments import add_data_arguments

    p = subparsers.add_parser(
        "eagle", help="EAGLE-3 draft by self-distillation (data + training-time test)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    add_train_arguments(p)
    p.add_argument("--skip-data", action="store_true", help="train on the cache as it is")
    p.set_defaults(func=lambda args: _run(args))


if __name__ == "__main__":
    sys.exit(main())
