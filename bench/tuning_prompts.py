"""Prompts for A/B runs that choose between two versions of the code or two settings: the
package's own prompt generators (the ones that make the drafters' training data), never the
benchmark's dev prompts, which are what the choice is then measured on.

Three stages of ``count`` prompts each: generic requests (seed 301), requests built around
the target's own greedy answers to them (302), and task-style requests over those pairs (303),
as sessions 20-24 ran them (bench/RESULTS.md).

    from bench.tuning_prompts import tuning_prompts
    prompts = tuning_prompts(loaded, count=4)   # 12 token lists, chat template applied
"""

from __future__ import annotations

SEEDS = (301, 302, 303)


def tuning_texts(loaded, count: int = 4, seeds: tuple = SEEDS, answer_tokens: int = 96) -> list:
    """The ``3 * count`` request texts (fewer when the first stage's answers are too short to
    build on): ``loaded`` is a :class:`~specdec_kernels.models.LoadedModel`, whose greedy
    answers to the first stage seed the other two."""
    from specdec_kernels.decoding import generate
    from specdec_kernels.models import encode_prompts
    from specdec_kernels.training.prompts import (
        first_stage_prompts,
        second_stage_prompts,
        task_prompts,
    )

    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    tok = loaded.tokenizer
    first = first_stage_prompts(count, seed=seeds[0])
    answers = [tok.decode(generate(loaded, encode_prompts(tok, [text]),
                                   max_new_tokens=answer_tokens).tokens[0],
                          skip_special_tokens=True) for text in first]
    return (first + second_stage_prompts(answers, count, seed=seeds[1])
            + task_prompts(list(zip(first, answers)), count, seed=seeds[2]))


def tuning_prompts(loaded, count: int = 4, seeds: tuple = SEEDS, answer_tokens: int = 96) -> list:
    """:func:`tuning_texts` as token lists under the model's chat template."""
    from specdec_kernels.models import encode_prompts

    return encode_prompts(loaded.tokenizer, tuning_texts(loaded, count, seeds, answer_tokens))
