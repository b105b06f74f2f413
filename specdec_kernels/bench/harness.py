"""Run every method on every prompt, interleaved, and collect one record per run."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

from specdec_kernels.bench.methods import BASELINE, RunRecord, Sampling
from specdec_kernels.bench.prompts import Prompt


@dataclass
class Measurement:
    """A :class:`RunRecord` with where it came from and whether it matched the baseline."""

    method: str
    question_ids: tuple  # the group run together (one prompt at batch size 1)
    category: str
    repeat: int
    record: RunRecord
    identical: bool | None = None  # greedy only: same tokens as the baseline

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(out.pop("record"))
        out["new_tokens"] = self.record.new_tokens
        return out


def group_prompts(prompts: list[Prompt], batch_size: int) -> list[list[Prompt]]:
    """Consecutive prompts of the same category in groups of at most ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    groups: list = []
    for prompt in prompts:
        last = groups[-1] if groups else None
        if last and last[0].category == prompt.category and len(last) < batch_size:
            last.append(prompt)
        else:
            groups.append([prompt])
    return groups


def run_benchmark(
    methods: dict,
    prompts: list[Prompt],
    encode,
    *,
    max_new_tokens: int,
    repeats: int,
    sampling: Sampling,
    batch_size: int = 1,
    order_seed: int = 0,
    progress=None,
) -> list[Measurement]:
    """Every method on every group of prompts ``repeats`` times.

    Methods run interleaved (for each repeat and group, all methods in a shuffled order) so
    that machine drift affects them alike. One short warm-up run per method comes first,
    untimed. A method that carries state from run to run (a suffix memory of earlier outputs:
    ``reset()``) starts every repeat empty, the warm-up's output forgotten.

    Parameters
    ----------
    methods : dict of name -> method
        Objects with ``run(prompts, max_new_tokens, sampling) -> RunRecord`` taking a batch
        of token id lists.
    prompts : list of Prompt
    encode : callable
        Prompt text -> token ids (chat template applied).
    max_new_tokens, repeats : int
    sampling : Sampling
    batch_size : int
        Prompts of one category decoded together.
    order_seed : int
        Seed of the shuffled method order.
    progress : callable, optional
        ``progress(method, label, seconds)``: called as each timed run starts (``seconds``
        None; ``label`` names the method and the group's first question) and when it ends
        (with its wall time), e.g. :class:`~specdec_kernels.bench.progress.BenchProgress`.
    """
    order = random.Random(order_seed)
    encoded = {p.question_id: encode(p.text) for p in prompts}
    groups = group_prompts(prompts, batch_size)
    warm_up = [encoded[p.question_id] for p in groups[0]]
    for method in methods.values():
        method.run(warm_up, min(8, max_new_tokens), sampling)

    measurements = []
    for repeat in range(repeats):
        for method in methods.values():
            getattr(method, "reset", lambda: None)()
        for group in groups:
            ids = tuple(p.question_id for p in group)
            batch = [encoded[i] for i in ids]
            names = list(methods)
            order.shuffle(names)
            for name in names:
                label = f"{name} q{ids[0]}"
                if progress is not None:
                    progress(name, label, None)
                start = time.perf_counter()
                record = methods[name].run(batch, max_new_tokens, sampling)
                if progress is not None:
                    progress(name, label, time.perf_counter() - start)
                measurements.append(Measurement(name, ids, group[0].category, repeat, record))
    if sampling.greedy:
        mark_identical(measurements)
    return measurements


def mark_identical(measurements: list[Measurement]) -> None:
    """Set ``identical`` on every measurement: same tokens as the baseline's on that group."""
    baseline = {
        (m.question_ids, m.repeat): m.record.tokens for m in measurements if m.method == BASELINE
    }
    for m in measurements:
        reference = baseline.get((m.question_ids, m.repeat))
        m.identical = None if reference is None else m.record.tokens == reference
