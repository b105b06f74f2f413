"""Token recycling's and the suffix drafter's starting priors and choices, from acceptance
measured on tuning requests (never the benchmark's prompts).

``collect`` runs the default model greedily (160 new tokens) on generic requests
(:func:`specdec_kernels.training.prompts.first_stage_prompts`, seed 101) and on requests built around
its answers (:func:`~specdec_kernels.training.prompts.second_stage_prompts`, seed 102: summarize,
translate, answer from a passage, rewrite, continue: text that copies from its input), and
keeps every answer with the target's top-8 at each of its positions.

``simulate`` replays the answers through the drafters step by step, as greedy decoding would
run them (a draft holds when it is the answer's next token): the suffix drafter and prompt
lookup exactly (their drafts depend on the text only); token recycling from the answer
positions' top-8 only (the real drafter also learns from the rows of rejected branches, which
a replay does not have). Per configuration it reports τ and the estimated speedup over plain
decoding on a step-cost curve (``tokens * c(1) / sum of c(width)``), and the acceptance tables
behind :data:`~specdec_kernels.decoding.token_recycling.RANK_PRIORS` and
:data:`~specdec_kernels.decoding.suffix.MATCH_PRIORS`:

    python3 -m bench.prophet_tuning collect --out tuning.json.gz
    python3 -m bench.prophet_tuning simulate --data tuning.json.gz [--curve curve.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import time

import torch

from specdec_kernels.decoding.budget import AcceptanceStats
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding.drafter import StepOutcome

TOP_K = 8


def collect(out: str, count: int = 24, max_new_tokens: int = 160) -> None:
    from specdec_kernels.decoding import generate
    from specdec_kernels.training.prompts import first_stage_prompts, second_stage_prompts
    from specdec_kernels.models import encode_prompts, load_default_model

    start = time.perf_counter()
    loaded = load_default_model(dtype=torch.float32)
    rows = []
    for stage in ("generic", "copying"):
        if stage == "generic":
            texts = first_stage_prompts(count, seed=101)
        else:
            answers = [loaded.tokenizer.decode(r["answer"], skip_special_tokens=True)
                       for r in rows]
            texts = second_stage_prompts(answers, count, seed=102)
        prompts = encode_prompts(loaded.tokenizer, texts)
        answers = []
        for i in range(0, len(prompts), 4):
            answers += generate(loaded, prompts[i : i + 4], max_new_tokens=max_new_tokens).tokens
        with torch.inference_mode():
            for prompt, answer in zip(prompts, answers):
                logits = loaded.model(torch.tensor([prompt + answer])).logits[0]
                top = logits.topk(TOP_K, -1).indices[len(prompt) - 1 :].tolist()
                rows.append({"stage": stage, "prompt": prompt, "answer": answer, "top": top})
    with gzip.open(out, "wt") as f:
        json.dump({"rows": rows, "seconds": round(time.perf_counter() - start, 1)}, f)
    print(f"wrote {out}: {len(rows)} answers, {sum(len(r['answer']) for r in rows)} tokens")


class _State:
    """The part of DecodeState the host drafters read, for one request."""

    def __init__(self, context: list, remaining: int, device):
        self.contexts, self.remaining, self.batch = [context], [remaining], 1
        self.device = device

    @property
    def pending(self):
        return torch.tensor([self.contexts[0][-1]], device=self.device)


def replay(make_drafter, rows: list, cost: StepCost, vocab_size: int, stats=None) -> dict:
    """Greedy decoding of the recorded answers with a drafter, step by step; each request's
    acceptance statistics are added to ``stats`` when given."""
    steps = tokens = 0
    spent = 0.0
    for row in rows:
        drafter = make_drafter()
        drafter.bind(_Runner(vocab_size), None)
        prompt, answer, top = row["prompt"], row["answer"], row["top"]
        state = _State(list(prompt), len(answer), "cpu")
        drafter.start(state)
        done = 0
        while done < len(answer):
            state.remaining[0] = len(answer) - done
            proposal = drafter.propose(state)
            node_tokens = proposal.tokens[0].tolist()
            parents = proposal.parents[0].tolist()
            path = [0]
            while done + len(path) < len(answer):  # the answer's last token comes as a bonus
                want = answer[done + len(path) - 1]
                child = next((j for j in range(1, len(parents))
                              if parents[j] == path[-1] and node_tokens[j] == want), None)
                if child is None:
                    break
                path.append(child)
            accepted = len(path) - 1
            previous = len(state.contexts[0]) - 1
            state.contexts[0].extend(answer[done : done + accepted + 1])
            drafter.accept(state, _outcome(previous, accepted, path, node_tokens, parents,
                                           top[done : done + accepted + 1], vocab_size))
            done += accepted + 1
            steps += 1
            spent += cost(sum(p != -2 for p in parents))
        if stats is not None:
            for key, (tried, held) in drafter._stats[0].counts.items():
                entry = stats.counts.setdefault(key, [0, 0])
                entry[0] += tried
                entry[1] += held
        drafter.finish()
        tokens += len(answer)
    return {"tau": tokens / steps, "speedup": tokens * cost(1) / spent, "steps": steps}


class _Runner:
    def __init__(self, vocab_size: int):
        self.vocab_size, self.device = vocab_size, torch.device("cpu")


def _outcome(previous, accepted, path, node_tokens, parents, top, vocab_size) -> StepOutcome:
    """What the step would hand the drafters, with the rows of the accepted path only (the
    replay has no logits for the rest: those rows are marked unused)."""
    width = len(parents)
    tokens = torch.full((1, width), -1, dtype=torch.int64)
    logits = torch.full((1, width, vocab_size), -1e9)
    for rank_row, node in zip(top, path):
        tokens[0, node] = node_tokens[node]
        logits[0, node, torch.tensor(rank_row)] = torch.arange(len(rank_row), 0, -1).float()
    rows = torch.tensor([path + [-1] * (width - len(path))])
    return StepOutcome([previous], [accepted], logits=logits, tree_width=width, tokens=tokens,
                       parents=torch.tensor([parents]), accepted_rows=rows)


def _variants():
    from specdec_kernels.decoding import PromptLookupDrafter, SuffixDrafter
    from specdec_kernels.decoding.token_recycling import (
        SuccessorTable,
        TokenRecyclingDrafter,
        prompt_successors,
    )

    class OneTokenRows(SuccessorTable):
        """The paper's table: rows keyed by one token only."""

        def update(self, *args):
            super().update(*args)
            self.pair_keys.fill_(-1)

        def start(self, prompts):
            super().start(prompts)
            self.pair_keys.fill_(-1)

    class WarmStart(TokenRecyclingDrafter):
        """The table kept from request to request (one object for the whole replay), each new
        prompt's own rows written over it."""

        def bind(self, runner, tokenizer):
            if self.table is None:
                super().bind(runner, tokenizer)

        def start(self, state):
            table = self.table
            old = (table.single, table.pair, table.pair_keys) if table.batch else None
            super().start(state)
            if old is not None:
                _, singles, _ = prompt_successors(state.contexts[0], self.k, table.vocab_size)
                fresh = torch.zeros(table.vocab_size + 1, dtype=torch.bool)
                fresh[[t for (t,) in singles]] = True
                table.single = torch.where(fresh[None, :, None], table.single, old[0])
                new_pair = table.pair_keys >= 0
                table.pair = torch.where(new_pair[..., None], table.pair, old[1])
                table.pair_keys = torch.where(new_pair, table.pair_keys, old[2])

    def one_token():
        drafter = TokenRecyclingDrafter()
        bind = drafter.bind

        def bind_one(runner, tokenizer):
            bind(runner, tokenizer)
            drafter.table = OneTokenRows(runner.vocab_size, drafter.k, runner.device)

        drafter.bind = bind_one
        return drafter

    warm = WarmStart()
    return {
        "prompt-lookup": PromptLookupDrafter,
        "token-recycling": TokenRecyclingDrafter,
        "token-recycling one-token rows": one_token,
        "token-recycling warm start": lambda: warm,
        "token-recycling max_depth=16": lambda: TokenRecyclingDrafter(max_depth=16),
        "token-recycling successors=4": lambda: TokenRecyclingDrafter(successors=4),
        "suffix": SuffixDrafter,
        "suffix min_match=2": lambda: SuffixDrafter(min_match=2),
        "suffix depth_per_match=1": lambda: SuffixDrafter(depth_per_match=1.0),
        "suffix depth_per_match=2": lambda: SuffixDrafter(depth_per_match=2.0),
        "suffix without budget": lambda: SuffixDrafter(budget=False),
    }


def simulate(data: str, curve=None, vocab_size: int = 49152, only=None) -> dict:
    with gzip.open(data, "rt") as f:
        rows = json.load(f)["rows"]
    cost = StepCost.load(curve)
    results = {}
    for stage in ("generic", "copying", "all"):
        chosen = [r for r in rows if stage in ("all", r["stage"])]
        for name, make in _variants().items():
            if only and not any(o in name for o in only):
                continue
            figures = replay(make, chosen, cost, vocab_size)
            results[f"{stage}: {name}"] = figures
            print(f"{stage:8s} {name:32s} tau {figures['tau']:.3f} "
                  f"speedup {figures['speedup']:.3f}", flush=True)
    tables = {}
    from specdec_kernels.decoding import SuffixDrafter, TokenRecyclingDrafter

    # Acceptance of the nodes each drafter proposes with its defaults (what its own running
    # statistics see, so what its priors stand for before any evidence).
    for name, make in (("token-recycling", TokenRecyclingDrafter),
                       ("suffix", SuffixDrafter)):
        stats = AcceptanceStats(max_rank=TOP_K - 1)
        replay(make, rows, cost, vocab_size, stats)
        tables[name] = stats.table()
        print(name, json.dumps(_summary(stats.table())), flush=True)
    return {"results": results, "acceptance": tables}


def _summary(table: dict) -> dict:
    """``{label: {"depth,rank": rate}}`` for depths 1-4 and ranks 0-3."""
    out = {}
    for label, cells in table.items():
        out[label] = {key: round(a / t, 3) for key, (t, a) in cells.items()
                      if t and int(key.split(",")[0]) <= 4 and int(key.split(",")[1]) <= 3}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.prophet_tuning",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="the tuning answers and the target's top-8")
    c.add_argument("--out", required=True)
    s = sub.add_parser("simulate", help="replay the answers through the drafters")
    s.add_argument("--data", required=True)
    s.add_argument("--curve", help="a bench.cost_curve JSON (default: the shipped curve)")
    s.add_argument("--out", help="write the figures and tables as JSON")
    s.add_argument("--only", help="comma list: run the variants whose name holds one")
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.out)
    else:
        result = simulate(args.data, args.curve,
                          only=args.only.split(",") if args.only else None)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
