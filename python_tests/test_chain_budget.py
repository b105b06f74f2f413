"""Chain drafters sized by the cost model (issue 21: no drafter the cost model would choose may
lose to the plain loop): :class:`ChainBudget` picks each step's chain length from the target's
and the draft's step costs and the measured acceptance, down to none while drafting does not
pay, and nothing in it is timed."""

import itertools
import math

import pytest
import torch

from python_tests.decoding_helpers import tiny_model, truncated_copy
from specdec_kernels.decoding import (
    DraftModelDrafter,
    SelfSpeculativeDrafter,
    calibration,
    generate,
)
from specdec_kernels.decoding.budget import (
    CHAIN_PRIOR,
    DEPTH_PRIOR_WEIGHT,
    MAX_PAUSE_STEPS,
    PAUSE_STEPS,
    PROBE_STEPS,
    ChainBudget,
    ChainBudgets,
)

FLAT = {1: 10.0, 128: 10.0}  # verifying more rows costs nothing extra


def brute_force_length(budget, cap):
    """The length maximising expected tokens per cost, by enumerating every length."""
    best, best_value = None, -1.0
    for k in range(1, cap + 1):
        rates = budget.rates(k)
        expected = 1.0 + sum(math.prod(rates[:i]) for i in range(1, k + 1))
        value = expected / (budget.target_cost(k + 1) + k * budget.draft_cost(1))
        if value > best_value + 1e-12:
            best, best_value = k, value
    return best


@pytest.mark.parametrize("accepted_rate, draft_ms", [(0.9, 0.5), (0.9, 3.0), (0.6, 1.0), (0.3, 0.2), (0.95, 0.1)])
def test_length_maximises_expected_tokens_per_cost(accepted_rate, draft_ms):
    target = {1: 10.0, 2: 10.5, 4: 11.0, 8: 13.0, 16: 18.0, 32: 30.0, 64: 55.0}
    budget = ChainBudget(target, {1: draft_ms, 64: draft_ms * 3})
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):  # evidence at depths 1..6
        budget.record(6, int((torch.rand(6, generator=gen) < accepted_rate).long().cumprod(0).sum()))
    for cap in (1, 2, 5, 9):
        budget.pause = type(budget.pause)()  # judge the length only
        assert budget.length(cap) == brute_force_length(budget, cap)


def test_acceptance_is_counted_by_depth_tried():
    budget = ChainBudget(FLAT, FLAT)
    for drafted, accepted in ((4, 0), (4, 2), (2, 2)):
        budget.record(drafted, accepted)
    # Depth 1 tried by all three, accepted by two; depth 2 tried by two, accepted by two;
    # depth 3 tried once (the request with 2 accepted of 4), rejected; the third request
    # drafted only 2, so its depth 3 was never tried.
    assert budget.report()["by_depth"] == [[3, 2], [2, 2], [1, 0]]
    # A depth leans on the one before with DEPTH_PRIOR_WEIGHT pseudo-observations; one never
    # tried is estimated as the one before.
    w = DEPTH_PRIOR_WEIGHT
    rates = budget.rates(5)
    assert rates[0] == pytest.approx((2 + CHAIN_PRIOR) / 4)
    assert rates[1] == pytest.approx((2 + w * rates[0]) / (2 + w))
    assert rates[2] == pytest.approx((0 + w * rates[1]) / (1 + w))
    assert rates[3] == rates[4] == pytest.approx(rates[2])


def test_an_accepted_chain_grows_to_the_cap():
    budget = ChainBudget({1: 10.0, 2: 10.5, 4: 11.5, 8: 14.0, 16: 20.0}, {1: 1.0, 16: 1.0})
    lengths = []
    for _ in range(12):
        lengths.append(budget.length(8))
        budget.record(lengths[-1], lengths[-1])
    assert lengths[0] == 2  # the prior's 0.5 a depth: two drafts are worth their cost
    assert lengths[-1] == 8 and lengths == sorted(lengths)


def test_a_chain_that_does_not_pay_pauses_longer_each_time_and_comes_back_when_it_pays():
    # A draft at a fifth of a target token whose drafts are all rejected.
    budget = ChainBudget(FLAT, {1: 2.0, 128: 2.0})
    pauses, run = [], 0
    while len(pauses) < 6:
        k = budget.length(3)
        if k == 0:
            run += 1
            continue
        if run:
            pauses.append(run)
            run = 0
        budget.record(k, 0)
    assert pauses == [min(PAUSE_STEPS * 2 ** i, MAX_PAUSE_STEPS) for i in range(6)]
    assert budget.report()["steps_paused"] == sum(pauses) + run
    # Every draft accepted: it pays from the first probe on, so it never pauses again, and
    # once the evidence outweighs the rejections it drafts the whole chain.
    while budget.length(3) == 0:
        pass
    lengths = []
    for _ in range(MAX_PAUSE_STEPS + 30):
        lengths.append(budget.length(3))
        budget.record(lengths[-1], lengths[-1])
    assert 0 not in lengths and lengths[-30:] == [3] * 30
    assert lengths == sorted(lengths)


def test_a_draft_that_cannot_pay_even_if_always_right_is_never_run():
    budget = ChainBudget({1: 10.0, 2: 11.0, 64: 60.0}, {1: 9.5, 64: 40.0})
    assert not budget.can_pay(8)
    assert [budget.length(8) for _ in range(300)] == [0] * 300
    assert budget.report()["steps_paused"] == 0 and budget.report()["lengths"] == {0: 300}
    # The same draft beside a target whose wider blocks cost nothing more can pay.
    assert ChainBudget(FLAT, {1: 9.5, 64: 40.0}).can_pay(8)
    # Guesses that cost nothing to make pay whenever a wider block costs less than a token.
    assert ChainBudget({1: 10.0, 2: 15.0, 64: 600.0}, None).can_pay(1)
    assert not ChainBudget({1: 10.0, 2: 20.0, 64: 640.0}, None).can_pay(8)


def test_bad_prior_is_refused():
    with pytest.raises(ValueError, match="first_draft_prior must be in"):
        ChainBudget(FLAT, FLAT, first_draft_prior=1.0)


def test_requests_have_budgets_of_their_own_and_finished_ones_stay_in_the_report():
    budgets = ChainBudgets(3, FLAT, {1: 1.0, 128: 1.0})
    for _ in range(30):
        lengths = budgets.lengths([4, 4, 4])
        budgets.record(lengths, [lengths[0], 0, lengths[2] // 2])  # request 1: all rejected
    assert budgets.running[0].lengths.get(4, 0) > 20  # always accepted: the whole chain
    assert budgets.running[1].pause.steps_paused >= PAUSE_STEPS
    budgets.select_requests([0, 2])
    report = budgets.report()
    assert report["steps_paused"] == sum(b.pause.steps_paused for b in budgets.finished + budgets.running)
    assert sum(report["lengths"].values()) == 90


# ---------------------------------------------------------------------------- in the loop


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab=48, layers=4, seed=3)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [3, 3, 3, 3, 3]]


def plain(model, prompts, max_new_tokens=40):
    return generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=[]).tokens


def test_a_draft_as_costly_as_the_target_never_runs_and_the_output_is_the_plain_loops(target):
    drafter = SelfSpeculativeDrafter(3, num_draft=2, cost_curve=FLAT, draft_cost_curve=FLAT)
    out = generate(target, PROMPTS, drafter=drafter, max_new_tokens=40, eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    assert list(out.stats.drafter_report["budget"]["lengths"]) == [0]
    assert all(not r.proposed_at for r in out.stats.requests)


def test_rejected_drafts_are_paused_and_the_output_is_the_plain_loops(target):
    """The first layer of 4 drafts on a random model: nearly every draft is rejected, so the
    budget pauses it."""
    drafter = SelfSpeculativeDrafter(1, num_draft=2, cost_curve=FLAT,
                                     draft_cost_curve={1: 2.0, 128: 2.0})
    out = generate(target, PROMPTS, drafter=drafter, max_new_tokens=40, eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    report = out.stats.drafter_report["budget"]
    assert report["steps_paused"] >= PAUSE_STEPS
    assert report["lengths"].get(0, 0) == report["steps_paused"]


def test_a_cheap_exact_draft_drafts_the_whole_chain_every_step(target):
    """The target's own copy as the draft: every draft is accepted, so the budget never pauses
    and keeps the longest chain allowed."""
    copy = truncated_copy(target, 4)
    drafter = DraftModelDrafter(copy, num_draft=4, cost_curve=FLAT,
                                draft_cost_curve={1: 0.5, 128: 0.5})
    out = generate(target, PROMPTS, drafter=drafter, max_new_tokens=40, eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    report = out.stats.drafter_report["budget"]
    assert report["steps_paused"] == 0
    assert set(report["lengths"]) <= {4, 3, 2, 1}  # shorter only near the token limit
    assert report["lengths"][4] >= out.stats.target_forwards - 3


def test_budgeted_sampling_repeats_with_the_same_seed(target):
    """No timing in the choice: a seeded sampled run is the same run twice."""
    def run():
        drafter = SelfSpeculativeDrafter(2, num_draft=3, cost_curve={1: 10.0, 4: 12.0, 128: 80.0},
                                         draft_cost_curve={1: 6.0, 128: 30.0})
        out = generate(target, PROMPTS, drafter=drafter, max_new_tokens=40, eos_token_id=[],
                       temperature=0.8, seed=[5, 6, 7])
        return out.tokens, out.stats.drafter_report["budget"]

    first, again = run(), run()
    assert first == again
    assert len(first[1]["lengths"]) >= 2  # the lengths did vary


def test_without_a_draft_cost_under_the_shipped_curve_k_is_used_as_given(target, monkeypatch):
    monkeypatch.setenv("SPECDEC_STEP_COST", "shipped")
    drafter = SelfSpeculativeDrafter(3, num_draft=2)
    out = generate(target, PROMPTS[:1], drafter=drafter, max_new_tokens=20, eos_token_id=[])
    assert "budget" not in out.stats.drafter_report


@pytest.mark.parametrize("make", [
    lambda model: SelfSpeculativeDrafter(3, num_draft=2),
    lambda model: DraftModelDrafter(truncated_copy(model, 2), num_draft=2),
])
def test_the_draft_cost_is_measured_once_per_machine(target, make, monkeypatch, tmp_path):
    """Machine mode: the draft's forward (the exit layer's, or the draft model's) is measured
    like the target's, once, and kept apart from the target's entry."""
    monkeypatch.setenv("SPECDEC_STEP_COST", "machine")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    measured = []

    def fake_target(runner, **kwargs):
        measured.append(("target", runner.num_layers))
        return {256: {1: 10.0, 128: 10.0}, 2048: {1: 20.0, 128: 20.0}}

    def fake_draft(target, draft, exit_layer=None, **kwargs):
        measured.append(("draft", draft.num_layers, exit_layer))
        return {256: {1: 0.2, 32: 0.4}, 2048: {1: 0.5, 32: 0.6}}

    monkeypatch.setattr(calibration, "measure_step_cost", fake_target)
    monkeypatch.setattr(calibration, "measure_draft_cost", fake_draft)
    for _ in range(2):
        drafter = make(target)
        out = generate(target, PROMPTS[:2], drafter=drafter, max_new_tokens=12, eos_token_id=[])
        assert out.tokens == plain(target, PROMPTS[:2], 12)
        assert "budget" in out.stats.drafter_report
        draft_cost = drafter._costs[1]  # in target tokens after as many cached tokens
        assert draft_cost(1) == pytest.approx(0.2 * 10.0)
        assert draft_cost(1, 2048) == pytest.approx(0.5 * 20.0)
        assert draft_cost(1, 1152) == pytest.approx((2.0 + 10.0) / 2)
    assert measured[0] == ("target", 4) and len(measured) == 2  # each once
    assert measured[1] in {("draft", 4, 3), ("draft", 2, None)}


def test_draft_cost_is_a_ratio_to_a_target_token_and_an_exit_layer_has_its_own_key(target):
    from specdec_kernels.decoding import ModelRunner

    runner = ModelRunner(target)
    try:
        assert "exit_layer" not in calibration.step_cost_key(runner)
        assert calibration.step_cost_key(runner, 3)["exit_layer"] == 3
        ratios = calibration.measure_draft_cost(runner, runner, exit_layer=1, widths=(1, 5),
                                                prefixes=(9, 5), rounds=1)
        assert list(ratios) == [5, 9]
        for ratio in ratios.values():
            assert list(ratio) == [1, 5] and 0 < ratio[1] <= ratio[5]
    finally:
        runner.release()


def test_budget_off_drafts_k_every_step(target):
    drafter = SelfSpeculativeDrafter(3, num_draft=2, budget=False, cost_curve=FLAT,
                                     draft_cost_curve=FLAT)
    out = generate(target, PROMPTS[:1], drafter=drafter, max_new_tokens=20, eos_token_id=[])
    assert "budget" not in out.stats.drafter_report
    assert out.tokens == plain(target, PROMPTS[:1], 20)
    request = out.stats.requests[0]
    assert request.proposed_at[1] >= request.target_forwards - 1  # 2 drafts on every step


def test_every_chain_length_choice_is_a_valid_cap():
    budget = ChainBudget({1: 10.0, 8: 10.0, 64: 60.0}, {1: 0.1, 64: 0.2})
    for cap in (0, 1, 7, 0, 3):
        k = budget.length(cap)
        assert 0 <= k <= cap and (cap == 0) == (k == 0)


def test_recalibrating_the_target_remeasures_its_drafts(target, monkeypatch, tmp_path):
    """A draft's cost is a ratio to the target's: ``specdec calibrate`` (``calibrate``) drops
    the target's draft entries on this machine, and only those."""
    from specdec_kernels.decoding import ModelRunner, machine_cache

    monkeypatch.setenv("SPECDEC_STEP_COST", "machine")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "measure_step_cost", lambda runner, **k: {256: {1: 10.0, 64: 20.0}})
    ratios = iter([{256: {1: 0.3}}, {256: {1: 0.6}}])
    monkeypatch.setattr(calibration, "measure_draft_cost", lambda *a, **k: next(ratios))
    runner, other = ModelRunner(target), ModelRunner(tiny_model("llama", vocab=48, layers=2))
    try:
        assert calibration.machine_draft_cost(runner, runner, 2) == {256: {1: 0.3}}
        machine_cache.store("draft_cost", {"target": calibration.step_cost_key(other)}, {"ratio": {"1": 0.9}})
        assert calibration.machine_draft_cost(runner, runner, 2) == {256: {1: 0.3}}  # cached
        calibration.calibrate(runner)
        assert calibration.machine_draft_cost(runner, runner, 2) == {256: {1: 0.6}}  # measured again
        kept = machine_cache.lookup("draft_cost", {"target": calibration.step_cost_key(other)})
        assert kept == {"ratio": {"1": 0.9}}
    finally:
        runner.release()
        other.release()


def test_jacobi_guesses_are_verified_only_while_they_pay(target):
    """Jacobi's guesses cost only their verification rows: on a flat curve they are free and
    verified every step; where each row costs something, the rejected guesses of a random
    model are paused; the output is the plain loop's either way, and without the budget every
    step verifies K guesses."""
    from specdec_kernels.decoding import JacobiDrafter

    out = generate(target, PROMPTS, drafter=JacobiDrafter(3, cost_curve=FLAT), max_new_tokens=40,
                   eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    report = out.stats.drafter_report["budget"]
    assert report["steps_paused"] == 0 and 0 not in report["lengths"]
    sloped = {1: 10.0, 2: 11.0, 4: 13.0, 8: 17.0, 16: 25.0}
    out = generate(target, PROMPTS, drafter=JacobiDrafter(3, cost_curve=sloped),
                   max_new_tokens=40, eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    report = out.stats.drafter_report["budget"]
    tried, accepted = report["by_depth"][0]
    assert accepted / tried < 0.2 and report["steps_paused"] >= PAUSE_STEPS

    # Jacobi's own prior (its guesses are rarely right) pauses them sooner than a chain's
    # default trust would.
    class Trusting(JacobiDrafter):
        first_draft_prior = CHAIN_PRIOR

    trusting = generate(target, PROMPTS, drafter=Trusting(3, cost_curve=sloped),
                        max_new_tokens=40, eos_token_id=[])
    assert trusting.tokens == out.tokens
    assert trusting.stats.drafter_report["budget"]["by_depth"][0][0] > tried
    # Verifying a guess costs as much as a token: never tried.
    steep = {t: 10.0 * t for t in (1, 2, 4, 8, 16)}
    out = generate(target, PROMPTS, drafter=JacobiDrafter(3, cost_curve=steep), max_new_tokens=40,
                   eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    assert all(not r.proposed_at for r in out.stats.requests)
    out = generate(target, PROMPTS[:1], drafter=JacobiDrafter(3, budget=False), max_new_tokens=20,
                   eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS[:1], 20)
    assert out.stats.requests[0].proposed_at[2] >= out.stats.requests[0].target_forwards - 3


@pytest.mark.parametrize("make", [
    lambda model: SelfSpeculativeDrafter(2, num_draft=3, cost_curve={1: 10.0, 4: 12.0, 128: 80.0},
                                         draft_cost_curve={1: 4.0, 128: 30.0}),
    lambda model: DraftModelDrafter(truncated_copy(model, 3), num_draft=4, cost_curve=FLAT,
                                    draft_cost_curve={1: 2.0, 128: 4.0}),
])
def test_a_budgeted_request_does_not_depend_on_its_batch(target, make):
    """Each request's chain is sized by its own budget, costed as if it ran alone: sampled with
    the same seed, a request gives the same tokens alone and in a batch."""
    kwargs = dict(max_new_tokens=24, temperature=1.0, eos_token_id=[])
    together = generate(target, PROMPTS, drafter=make(target), seed=[5, 6, 7], **kwargs)
    lengths = together.stats.drafter_report["budget"]["lengths"]
    assert len(lengths) >= 2  # the budget did choose
    for i, prompt in enumerate(PROMPTS):
        alone = generate(target, [prompt], drafter=make(target), seed=[5 + i], **kwargs)
        assert alone.tokens[0] == together.tokens[i]


def test_blockwise_guesses_are_paused_while_they_do_not_pay(target):
    """Random heads rarely guess right: where each verified row costs something the budget
    pauses them (and skips the heads), the output stays the plain loop's; without the budget
    every step verifies the whole chain."""
    from python_tests.decoding_helpers import random_heads
    from specdec_kernels.decoding import BlockwiseDrafter

    heads = random_heads(target.config.hidden_size, target.config.vocab_size, num_heads=3)
    sloped = {1: 10.0, 2: 11.0, 4: 13.0, 8: 17.0, 16: 25.0}
    out = generate(target, PROMPTS, drafter=BlockwiseDrafter(heads, num_draft=3, cost_curve=sloped),
                   max_new_tokens=40, eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS)
    report = out.stats.drafter_report["budget"]
    tried, accepted = report["by_depth"][0]
    assert accepted / tried < 0.2 and report["steps_paused"] >= PAUSE_STEPS
    fixed = BlockwiseDrafter(heads, num_draft=3, cost_curve=sloped, budget=False)
    out = generate(target, PROMPTS[:1], drafter=fixed, max_new_tokens=20, eos_token_id=[])
    assert out.tokens == plain(target, PROMPTS[:1], 20) and "budget" not in out.stats.drafter_report
    assert out.stats.requests[0].proposed_at[2] >= out.stats.requests[0].target_forwards - 3


def test_a_few_unlucky_first_steps_do_not_pause_a_drafter_the_prior_trusts():
    # The quantized copy's case (qa, 2026-11-27): a draft trusted at 0.75 whose first six
    # single drafts went rejected, rejected, accepted, rejected, accepted, accepted. At 0.55 of
    # a target token a draft, its realized credit alone (averages from the first step: 5.4
    # against 5.7) would pause it for PAUSE_STEPS; from the prior's expectation it does not.
    target = {1: 10.0, 2: 10.2, 4: 10.6, 8: 11.5}
    budget = ChainBudget(target, {1: 5.5, 8: 5.5}, first_draft_prior=0.75)
    for accepted in [0, 0, 1, 0, 1, 1]:
        assert budget.length(1) == 1
        budget.record(1, accepted)
    assert budget.length(1) == 1 and budget.report()["steps_paused"] == 0
    # Six rejections in a row still pause it.
    for _ in range(PROBE_STEPS):
        budget.record(1, 0)
    assert budget.length(1) == 0
