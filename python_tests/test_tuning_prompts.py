"""The A/B runs' tuning prompts (bench/tuning_prompts.py): made by the package's generators,
never from the benchmark, and the same every time."""

import pytest

from bench.tuning_prompts import tuning_prompts, tuning_texts
from specdec_kernels.training.prompts import benchmark_ngrams, shares_benchmark_text


@pytest.mark.default_model
def test_tuning_prompts_are_three_stages_off_the_benchmark_and_repeatable(loaded):
    texts = tuning_texts(loaded, count=2, answer_tokens=48)
    assert 4 <= len(texts) <= 6 and len(set(texts)) == len(texts)
    grams = benchmark_ngrams()
    assert not any(shares_benchmark_text(t, grams) for t in texts)
    # The later stages are built on the target's greedy answers, which are deterministic.
    assert tuning_texts(loaded, count=2, answer_tokens=48) == texts
    prompts = tuning_prompts(loaded, count=2, answer_tokens=48)
    assert len(prompts) == len(texts) and all(isinstance(t, int) for p in prompts for t in p)


def test_tuning_prompts_refuse_no_prompts():
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        tuning_texts(None, count=0)
