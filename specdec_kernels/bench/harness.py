"""Run every method on every prompt, interleaved, and collect one record per run."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from specdec_kernels.bench.methods import BASELINE, RunRecord, Sampling
from specdec_kernels.bench.prompts import Prompt


@dataclass
class Measurement:
    """A :class:`RunRecord` with where it came from and whether it matched the baseline."""

    method: str
    question_id: int
    category: str
    repeat: int
    record: RunRecord
    identical: bool | None = None  # greedy only: same tokens as the baseline

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(out.pop("record"))
        out["new_tokens"] = len(self.record.tokens)
        return out


def run_benchmark(
    methods: dict,
    prompts: list[Prompt],
    encode,
    *,
    max_new_tokens: int,
    repeats: int,
    sampling: Sampling,
    order_seed: int = 0,
    progress=None,
) -> list[Measurement]:
    """Every method on every prompt ``repeats`` times.

    Methods run interleaved (for each repeat and prompt, all methods in a shuffled order) so that
    machine drift affects them alike. One short warm-up run per method comes first, untimed.

    Parameters
    ----------
    methods : dict of name -> method
        Objects with ``run(prompt_ids, max_new_tokens, sampling) -> RunRecord``.
    prompts : list of Prompt
    encode : callable
        Prompt text -> token ids (chat template applied).
    max_new_tokens, repeats : int
    sampling : Sampling
    order_seed : int
        Seed of the shuffled method order.
    progress : callable, optional
        Called with a short label after each run (e.g. a progress bar's update).
    """
    order = random.Random(order_seed)
    encoded = {p.question_id: encode(p.text) for p in prompts}
    warm_ids = encoded[prompts[0].question_id]
    for method in methods.values():
        method.run(warm_ids, min(8, max_new_tokens), sampling)

    measurements = []
    for repeat in range(repeats):
        for prompt in prompts:
            names = list(methods)
            order.shuffle(names)
            for name in names:
                record = methods[name].run(encoded[prompt.question_id], max_new_tokens, sampling)
                measurements.append(
                    Measurement(name, prompt.question_id, prompt.category, repeat, record)
                )
                if progress is not None:
                    progress(f"{name} q{prompt.question_id}")
    if sampling.greedy:
        mark_identical(measurements)
    return measurements


def mark_identical(measurements: list[Measurement]) -> None:
    """Set ``identical`` on every measurement: same tokens as the baseline's on that prompt."""
    baseline = {
        (m.question_id, m.repeat): m.record.tokens for m in measurements if m.method == BASELINE
    }
    for m in measurements:
        reference = baseline.get((m.question_id, m.repeat))
        m.identical = None if reference is None else m.record.tokens == reference
