"""Self-distillation data at scale: the frozen target answers prompts made by this package
(never the benchmark's), in large batches through the package's own engine, and the target
features every drafter trainer needs are recorded on the way through the engine's
target-features doorway (no second forward).

The cache is a folder of chunks, each written whole or not at all (``chunk_NNNN.safetensors``
plus ``chunk_NNNN.json``), so a run stopped anywhere resumes at the first missing chunk. A
chunk holds, for ``S`` sequences (prompt then answer) of ``N`` tokens in all:

- ``tokens`` ``[N]`` int32, the sequences one after the other (``offsets`` ``[S + 1]``);
- ``prompt_lens`` ``[S]`` int32 and ``sampled`` ``[S]`` uint8 (greedy or sampled answer);
- ``features`` ``[N, P * H]`` bfloat16: row ``j`` is the target's hidden states at the ``P``
  capture points (decoder layers, then the final norm) for token ``j``, i.e. the states whose
  logits predict token ``j + 1``; a sequence's last token has none (zeros).

The JSON beside it holds the prompts, the answers' text and the capture points. Everything is
plain tensors (safetensors) and JSON: loading runs no pickled code.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_kernels.decoding.drafter import NoDrafter
from specdec_kernels.decoding.runner import FeatureSpec
from specdec_kernels.training.arguments import add_data_arguments

__all__ = [
    "DataCache",
    "FeatureRecorder",
    "default_capture_layers",
    "generate_chunk",
    "greedy_answers",
    "is_feature_cache",
    "self_written_prompts",
    "usable_request",
    "user_turn_prefix",
]


def default_capture_layers(num_layers: int) -> tuple:
    """EAGLE-3's low, middle and high layers (outputs of decoder layers 2, L/2 and L-3),
    then the final norm (what Medusa heads and the teacher distribution read)."""
    low, mid, high = min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)
    return (low, mid, high, "final_norm")


class FeatureRecorder(NoDrafter):
    """Plain decoding that records the target features of every prompt row (after the
    prefill) and of every emitted token's row (after each step), on the host in bf16."""

    name = "feature-recorder"

    def __init__(self, layers: tuple):
        self.target_features = FeatureSpec(tuple(layers), prompt_rows="all")

    def start(self, state) -> None:
        self.ids = list(range(state.batch))
        counts = state.feature_counts.tolist()
        feats = state.features.to(torch.bfloat16).cpu()
        self.rows = [[feats[b, : counts[b]]] for b in range(state.batch)]

    def accept(self, state, outcome) -> None:
        last = state.last_features().to(torch.bfloat16).cpu()
        for b, r in enumerate(self.ids):
            self.rows[r].append(last[b : b + 1])

    def select_requests(self, keep: list) -> None:
        self.ids = [self.ids[b] for b in keep]

    def per_request(self) -> list:
        return [torch.cat(r) for r in self.rows]


def answer_prompts(loaded, prompts: list, recorder, *, max_new_tokens: int,
                   sampled_fraction: float, temperature: float = 0.8, top_p: float = 0.95,
                   seed: int = 0):
    """The frozen target's answers to ``prompts`` (chat template applied), a share
    ``sampled_fraction`` of them sampled (``temperature``, ``top_p``; one seed per request from
    ``seed``) and the rest greedy, with ``recorder`` (a drafter that drafts nothing and records
    target features) riding along.

    Returns
    -------
    ids : list of list of int
        The encoded prompts.
    sampled : list of bool
    out : GenerationOutput
    seconds : float
        Wall time of the generation.
    """
    from specdec_kernels.decoding import generate
    from specdec_kernels.models import encode_prompts

    rng = random.Random(seed)
    ids = encode_prompts(loaded.tokenizer, prompts)
    sampled = [rng.random() < sampled_fraction for _ in prompts]
    t0 = time.perf_counter()
    out = generate(
        loaded.model, ids, drafter=recorder, tokenizer=loaded.tokenizer,
        max_new_tokens=max_new_tokens,
        temperature=[temperature if s else 0.0 for s in sampled],
        top_p=[top_p if s else 1.0 for s in sampled],
        seed=[seed * 100003 + i for i in range(len(prompts))],
    )
    return ids, sampled, out, time.perf_counter() - t0


def user_turn_prefix(tokenizer) -> list:
    """Token ids of the chat template up to where a user's request begins (its system turn,
    if it adds one, then the opening of a user turn): what a chat model is given to write a
    request of its own.

    Raises
    ------
    ValueError
        The tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written prompts need a chat model: the tokenizer has no chat "
                         "template")
    marker = "\u2063request\u2063"  # a text no template writes itself
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return list(tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"])


#: Bounds of a self-written request kept for the data: shorter ones are mostly greetings,
#: and a request cut off by the token limit is not a whole request.
MIN_REQUEST_WORDS = 4
MAX_REQUEST_TOKENS = 256


def self_written_prompts(loaded, count: int, *, seed: int, exclude=(),
                         temperature: float = 1.0, top_p: float = 0.98) -> list:
    """``count`` requests the frozen target writes itself: given only the opening of a user
    turn of its chat template (:func:`user_turn_prefix`), a chat model continues with the
    kind of request it was tuned to answer (Magpie, Xu et al. 2024), so the data follows the
    requests users send it rather than this package's templates.

    Sampled (``temperature``, ``top_p``, one seed per request from ``seed``). Kept: requests
    that end the turn within :data:`MAX_REQUEST_TOKENS` tokens and pass
    :func:`usable_request` (not in ``exclude``, not kept already, no text of a benchmark
    prompt). Rounds of writing continue until ``count`` are kept (at most 8 rounds: a model that
    never ends its turn gives fewer).

    Returns
    -------
    list of str
        At most ``count`` requests, in the order written.
    """
    from specdec_kernels.decoding import generate
    from specdec_kernels.training.prompts import benchmark_ngrams

    prefix = user_turn_prefix(loaded.tokenizer)
    grams = benchmark_ngrams()
    seen = set(exclude)
    kept: list = []
    for round_ in range(8):
        want = count - len(kept)
        if want <= 0:
            break
        batch = want + want // 4 + 2  # some are dropped
        out = generate(
            loaded.model, [prefix] * batch, tokenizer=loaded.tokenizer,
            max_new_tokens=MAX_REQUEST_TOKENS, temperature=temperature, top_p=top_p,
            seed=[(seed * 8 + round_) * 100003 + i for i in range(batch)],
        )
        for text, reason in zip(out.text, out.finish_reasons):
            text = text.strip()
            if usable_request(text, reason, seen, grams):
                seen.add(text)
                kept.append(text)
    return kept[:count]


def usable_request(text: str, finish_reason: str, seen, grams: set) -> bool:
    """Whether a self-written request (stripped ``text``, how its turn ended) is kept: it
    ended its turn (``finish_reason`` ``"eos"``), has :data:`MIN_REQUEST_WORDS` words or
    more, is not in ``seen`` and shares no run of words with a benchmark prompt (``grams``:
    :func:`~specdec_kernels.training.prompts.benchmark_ngrams`)."""
    from specdec_kernels.training.prompts import shares_benchmark_text

    return (finish_reason == "eos" and len(text.split()) >= MIN_REQUEST_WORDS
            and text not in seen and not shares_benchmark_text(text, grams))


def generate_chunk(loaded, prompts: list, path: Path, *, layers: tuple, max_new_tokens: int,
                   sampled_fraction: float, temperature: float = 0.8, top_p: float = 0.95,
                   seed: int = 0) -> dict:
    """Answer ``prompts`` with the frozen target and write chunk ``path`` (``.safetensors``;
    its ``.json`` beside it). Returns the chunk's figures (tokens, seconds)."""
    from safetensors.torch import save_file

    recorder = FeatureRecorder(layers)
    ids, sampled, out, seconds = answer_prompts(
        loaded, prompts, recorder, max_new_tokens=max_new_tokens,
        sampled_fraction=sampled_fraction, temperature=temperature, top_p=top_p, seed=seed)
    feats = recorder.per_request()
    tokens, rows, offsets = [], [], [0]
    for i in range(len(prompts)):
        seq = ids[i] + out.tokens[i]
        f = feats[i][: len(seq) - 1]  # the last token never ran through the target
        pad = f.new_zeros(len(seq) - f.shape[0], f.shape[1])
        tokens.extend(seq)
        rows.append(torch.cat([f, pad]))
        offsets.append(len(tokens))
    tensors = {
        "tokens": torch.tensor(tokens, dtype=torch.int32),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_lens": torch.tensor([len(p) for p in ids], dtype=torch.int32),
        "sampled": torch.tensor(sampled, dtype=torch.uint8),
        "features": torch.cat(rows).contiguous(),
    }
    new_tokens = sum(len(t) for t in out.tokens)
    meta = {"prompts": list(prompts), "answers": out.text, "layers": list(layers),
            "new_tokens": new_tokens, "seconds": round(seconds, 1),
            "tokens_per_second": round(new_tokens / seconds, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    path.with_suffix(".json").write_text(json.dumps(meta))
    tmp.rename(path)  # the chunk exists only once whole
    return meta


def is_feature_cache(folder) -> bool:
    """Whether ``folder`` is a cache of this module (its manifest names the capture points),
    not a Medusa-only cache of :mod:`specdec_kernels.training.medusa_data`."""
    manifest = Path(folder) / "manifest.json"
    return manifest.is_file() and "layers" in json.loads(manifest.read_text())


@dataclass
class DataCache:
    """The chunks of a cache folder, loaded into flat tensors (see the module notes).

    Attributes
    ----------
    tokens : Tensor
        ``[N]`` int64, every sequence one after the other.
    offsets : Tensor
        ``[S + 1]`` int64 sequence starts.
    prompt_lens : Tensor
        ``[S]`` int64.
    sampled : Tensor
        ``[S]`` bool.
    features : Tensor
        ``[N, P * H]`` bfloat16.
    layers : list
        The ``P`` capture points.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    prompt_lens: torch.Tensor
    sampled: torch.Tensor
    features: torch.Tensor
    layers: list
    answers: list

    @classmethod
    def load(cls, folder, max_chunks: int | None = None) -> "DataCache":
        from safetensors.torch import load_file

        paths = sorted(Path(folder).glob("*/chunk_*.safetensors"))
        paths += sorted(Path(folder).glob("chunk_*.safetensors"))
        if max_chunks is not None:
            paths = paths[:max_chunks]
        if not paths:
            raise FileNotFoundError(f"no data chunks under {folder} (run the data phase first)")
        toks, offs, plens, samp, feats, answers, layers = [], [0], [], [], [], [], None
        base = 0
        for p in paths:
            t = load_file(str(p))
            meta = json.loads(p.with_suffix(".json").read_text())
            if layers is None:
                layers = meta["layers"]
            elif meta["layers"] != layers:
                raise ValueError(f"{p} was recorded at {meta['layers']}, the rest at {layers}")
            toks.append(t["tokens"].long())
            offs.extend((t["offsets"][1:] + base).tolist())
            base += int(t["tokens"].numel())
            plens.append(t["prompt_lens"].long())
            samp.append(t["sampled"].bool())
            feats.append(t["features"])
            answers.extend(meta["answers"])
        return cls(torch.cat(toks), torch.tensor(offs), torch.cat(plens), torch.cat(samp),
                   torch.cat(feats), layers, answers)

    @property
    def num_sequences(self) -> int:
        return self.prompt_lens.numel()

    def answer_tokens(self) -> int:
        lens = self.offsets[1:] - self.offsets[:-1]
        return int((lens - self.prompt_lens).sum())

    def split(self, held_out: float, seed: int = 0):
        """``(train, test)`` sequence indices: the test part is a share of the greedy
        answers (what greedy decoding sees)."""
        greedy = [i for i in range(self.num_sequences) if not bool(self.sampled[i])]
        random.Random(seed).shuffle(greedy)
        test = set(greedy[: max(1, int(round(held_out * len(greedy))))])
        train = [i for i in range(self.num_sequences) if i not in test]
        return train, sorted(test)

    def medusa_records(self) -> list:
        """The answers as Medusa training records (``specdec train medusa`` on this cache):
        per answer, ``tokens`` (the prompt's last token, then the answer) and ``features``
        (float16: row ``j`` the final-norm state whose logits gave ``tokens[j]``)."""
        hidden = self.features.shape[1] // len(self.layers)
        columns = self.point_slice("final_norm", hidden)
        records = []
        for i in range(self.num_sequences):
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            first = start + max(int(self.prompt_lens[i]) - 1, 1)
            records.append({
                "tokens": self.tokens[first:end].tolist(),
                "features": self.features[first - 1 : end - 1, columns].to(torch.float16),
                "sampled": bool(self.sampled[i]),
            })
        return records

    def point_slice(self, point, hidden: int) -> slice:
        """Columns of ``features`` holding capture point ``point``."""
        index = [str(p) for p in self.layers].index(str(point))
        return slice(index * hidden, (index + 1) * hidden)


#: The stages of a cache, each a subfolder of chunks.
STAGES = ("first", "second", "tasks", "self")

#: The stages that follow the first one, in the order chunk_jobs interleaves them.
LATER_STAGES = STAGES[1:]


def answered(folder) -> list:
    """``(prompt, answer)`` of every chunk so far in ``folder`` (a cache, or one stage of it),
    read from the chunks' JSON (no tensors loaded)."""
    folder = Path(folder)
    paths = sorted(folder.glob("chunk_*.json"))
    paths += [p for stage in STAGES for p in sorted((folder / stage).glob("chunk_*.json"))]
    pairs = []
    for path in paths:
        meta = json.loads(path.read_text())
        pairs.extend(zip(meta["prompts"], meta["answers"]))
    return pairs


def greedy_answers(folder) -> list:
    """The greedy answers' text of every chunk of cache ``folder`` (the sampled ones left
    out: a datastore of them would propose what greedy decoding does not write), read from
    the chunks' JSON and their ``sampled`` flags (no features loaded)."""
    from safetensors import safe_open

    folder = Path(folder)
    paths = [p for stage in STAGES for p in sorted((folder / stage).glob("chunk_*.safetensors"))]
    texts = []
    for path in paths:
        with safe_open(str(path), "pt") as chunk:
            sampled = chunk.get_tensor("sampled").tolist()
        answers = json.loads(path.with_suffix(".json").read_text())["answers"]
        texts.extend(a for a, s in zip(answers, sampled) if not s)
    return texts


def chunk_jobs(first_chunks: int, second_chunks: int, task_chunks: int,
               self_chunks: int = 0) -> list:
    """The order of a cache's chunks, ``(stage, index)``: the later stages (``second`` and
    ``tasks`` build on earlier answers; ``self``, the target's own requests) interleave with
    the first stage's chunks, so a run cut short holds every kind; what is left of them
    follows the first stage."""
    jobs, done = [], dict.fromkeys(LATER_STAGES, 0)
    wanted = dict(zip(LATER_STAGES, (second_chunks, task_chunks, self_chunks)))
    every = {k: max(1, first_chunks // max(n, 1)) for k, n in wanted.items()}
    for c in range(first_chunks):
        jobs.append(("first", c))
        for stage in LATER_STAGES:
            if done[stage] < wanted[stage] and (c + 1) % every[stage] == 0:
                jobs.append((stage, done[stage]))
                done[stage] += 1
    for stage in LATER_STAGES:
        jobs.extend((stage, i) for i in range(done[stage], wanted[stage]))
    return jobs


def build_data(args, log=print) -> Path:
    """Generate (or resume) the cache ``args.data``: first-stage prompts from the topic list
    and templates; second-stage prompts built around the first stage's answers (summaries,
    translations, questions on a passage, rewrites); task-stage prompts in the forms users send
    (code, short questions, word problems, translations into English, ``Summarize:`` over long
    text, extraction), the text-based ones built on every answer so far; self-stage prompts
    written by the target itself (:func:`self_written_prompts`). Stops starting chunks
    after ``args.time_budget`` seconds (a resumable piece of a long run)."""
    from specdec_kernels.training.medusa_data import refuse_pickles
    from specdec_kernels.training.prompts import (
        first_stage_prompts,
        second_stage_prompts,
        task_prompts,
    )
    from specdec_kernels.models import load_model

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    data = Path(args.data)
    for stage in STAGES:  # before the model loads
        refuse_pickles(data / stage)
    loaded = load_model(args.model)
    layers = default_capture_layers(int(loaded.model.config.num_hidden_layers))
    manifest_path = data / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    if manifest and manifest.get("layers") != list(layers):
        raise ValueError(f"{data} holds features at {manifest.get('layers')}, not {layers}")
    t0 = time.perf_counter()
    size = args.batch_size
    first = first_stage_prompts(args.first_prompts, seed=args.seed)
    jobs = chunk_jobs(-(-len(first) // size), -(-args.second_prompts // size),
                      -(-args.task_prompts // size), -(-args.self_prompts // size))
    seed_offsets = {"first": 0, "second": 5000, "tasks": 9000, "self": 13000}
    for stage, c in jobs:
        path = data / stage / f"chunk_{c:04d}.safetensors"
        if path.exists():
            continue
        if args.time_budget and time.perf_counter() - t0 > args.time_budget:
            log(f"time budget reached; run again to resume at {stage}/{path.name}")
            break
        seed = args.seed * 7919 + c + seed_offsets[stage]
        if stage == "first":
            prompts = first[c * size : (c + 1) * size]
        elif stage == "second":
            answers = [a for _, a in answered(data / "first")]
            prompts = second_stage_prompts(answers, size, seed=seed)
        elif stage == "tasks":
            prompts = task_prompts(answered(data), size, seed=seed)
        else:
            prompts = self_written_prompts(loaded, size, seed=seed,
                                           exclude={p for p, _ in answered(data)})
        meta = generate_chunk(
            loaded, prompts, path, layers=layers, max_new_tokens=args.max_new_tokens,
            sampled_fraction=args.sampled_fraction, seed=seed,
        )
        manifest.setdefault("chunks", {})[f"{stage}/{path.name}"] = {
            k: meta[k] for k in ("new_tokens", "seconds", "tokens_per_second")
        }
        log(f"{stage}/{path.name}: {len(prompts)} prompts, {meta['new_tokens']} new tokens, "
            f"{meta['seconds']} s ({meta['tokens_per_second']} tokens/s)")
        manifest.update({
            "model": args.model, "layers": list(layers), "first_prompts": args.first_prompts,
            "second_prompts": args.second_prompts, "task_prompts": args.task_prompts,
            "self_prompts": args.self_prompts,
            "max_new_tokens": args.max_new_tokens, "batch_size": size,
            "sampled_fraction": args.sampled_fraction, "seed": args.seed,
        })
        manifest_path.write_text(json.dumps(manifest, indent=1))
    return data


def main(argv=None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python3 -m specdec_kernels.training.selfdistill", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(parser)
    build_data(parser.parse_args(argv), log=lambda m: print(m, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
