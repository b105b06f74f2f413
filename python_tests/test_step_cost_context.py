"""The step's cost at the step's context (issue 21): a verified row costs more after 2k cached
tokens than after 256, so the calibration measures ``c(T)`` after a short and a long prefix,
:class:`StepCost` answers ``c(T, context)`` between and past them, and every budget (trees,
chains, the static templates) is costed at the context of the step it sizes. Outputs stay the
plain loop's whatever the sizes."""

import pytest

from python_tests.decoding_helpers import tiny_model
from specdec_kernels.decoding import (
    MultiDrafter,
    PromptLookupDrafter,
    SuffixDrafter,
    TokenRecyclingDrafter,
    generate,
)
from specdec_kernels.decoding.budget import (
    ChainBudget,
    TreeBudget,
    choose_tree,
    path_probabilities,
)
from specdec_kernels.decoding.cost import StepCost

SHORT = {1: 10.0, 4: 11.0, 16: 14.0}
LONG = {1: 12.0, 4: 17.0, 16: 38.0}


def two_context_curve(short_prefix=256, long_prefix=2048):
    return StepCost.by_context({long_prefix: LONG, short_prefix: SHORT})


@pytest.mark.parametrize("width", [1, 3, 4, 9, 16, 40])
def test_cost_is_linear_in_the_context_between_and_past_the_measured_ones(width):
    curve = two_context_curve()
    short, long = StepCost(SHORT)(width), StepCost(LONG)(width)
    assert curve(width) == curve(width, 256) == short  # None: the shortest context's
    assert curve(width, 0) == short  # before the shortest: clamped there
    assert curve(width, 2048) == pytest.approx(long)
    assert curve(width, 1152) == pytest.approx((short + long) / 2)  # halfway
    assert curve(width, 3840) == pytest.approx(long + (long - short))  # one more span past
    assert curve.points == StepCost(SHORT).points and curve.prefixes == [256, 2048]


def test_three_contexts_use_the_span_around_the_context():
    middle = {1: 11.0, 4: 12.0, 16: 20.0}
    curve = StepCost.by_context({0: SHORT, 100: middle, 300: LONG})
    assert curve(16, 50) == pytest.approx(17.0)
    assert curve(16, 200) == pytest.approx(29.0)
    assert curve(16, 500) == pytest.approx(38.0 + 18.0 * 200 / 200)


def test_a_longer_context_never_reads_cheaper():
    """A long curve measured below the short one (noise) does not make the cost fall."""
    curve = StepCost.by_context({8: {1: 10.0, 16: 20.0}, 64: {1: 9.0, 16: 19.0}})
    assert [curve(16, c) for c in (8, 32, 64, 500)] == [20.0] * 4


def test_a_curve_of_one_context_ignores_the_context():
    curve = StepCost(SHORT)
    assert curve.prefixes == [None]
    assert [curve(9, c) for c in (None, 0, 10_000)] == [curve(9)] * 3


def test_load_reads_the_calibrations_format(tmp_path):
    stored = {"latency_ms_by_prefix": {"2048": {"1": 12.0, "16": 38.0}, "256": {"1": 10.0, "16": 14.0}}}
    path = tmp_path / "curve.json"
    path.write_text(__import__("json").dumps(stored))
    for curve in (StepCost.load(stored), StepCost.load(path)):
        assert curve.prefixes == [256, 2048] and curve(16, 2048) == 38.0


@pytest.mark.parametrize("bad, match", [
    ({}, "latency_ms_by_prefix needs curves"),
    ({-1: SHORT}, "latency_ms_by_prefix needs curves at prefixes >= 0"),
    ({0: {1: 0.0}}, "positive costs"),
    ({0: {0: 1.0}}, "positive costs at T >= 1"),
])
def test_bad_curves_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        StepCost.by_context(bad)


def likely_chain(depth=12, cond=0.8):
    parents = list(range(-1, depth))
    return parents, path_probabilities(parents, [1.0] + [cond] * depth)


def test_a_tree_shrinks_as_the_context_grows():
    """The same candidates: the budget keeps fewer nodes where each row costs more, and what
    it keeps is the best size at that context's cost."""
    curve = two_context_curve()
    budget = TreeBudget(curve, max_nodes=12)
    chain = likely_chain()
    sizes = []
    for context in (None, 256, 1000, 2048, 4000):
        (kept,), expected, cost = budget.choose([chain], context)
        assert cost == pytest.approx(curve(len(kept), context))
        best = max(range(13), key=lambda n: sum(chain[1][: n + 1]) / curve(n + 1, context))
        assert len(kept) - 1 == best, context
        sizes.append(len(kept))
    assert sizes[0] == sizes[1] and sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]


def test_a_static_template_and_a_chain_shrink_as_the_context_grows():
    curve = two_context_curve()
    rates = [[0.8, 0.1]] * 8
    short, _, _ = choose_tree(rates, curve, max_nodes=16)
    long, _, _ = choose_tree(rates, curve, max_nodes=16, context=4000)
    assert len(long) < len(short)
    budget = ChainBudget(curve, None, first_draft_prior=0.8)
    assert budget.length(12, 4000) < budget.length(12, 256)
    budget.record(3, 1)  # costed at the last length's context
    assert budget.context == 256


def test_a_draft_that_costs_more_at_a_long_context_drafts_less_there():
    """The target's curve alone the same at every context: only the draft's grows."""
    target = StepCost({1: 10.0, 16: 10.0})
    draft = StepCost.by_context({256: {1: 1.0}, 2048: {1: 6.0}})
    budget = ChainBudget(target, draft, first_draft_prior=0.8)
    assert budget.cost(3, 2048) == pytest.approx(10.0 + 3 * 6.0)
    assert budget.length(12, 2048) < budget.length(12, 256)


class RecordedWidths:
    """Wraps a drafter's propose: each step's context and tree width."""

    def __init__(self, drafter):
        self.seen = []
        propose = drafter.propose

        def recorded(state):
            proposal = propose(state)
            self.seen.append((state.context_length, proposal.tokens.shape[1]))
            return proposal

        drafter.propose = recorded


# Free up to 20 cached rows; from 40 a second row costs 4 first rows: no draft can pay.
STOPS_AT_40 = StepCost.by_context({20: {1: 1.0, 64: 1.0}, 40: {1: 1.0, 2: 4.0, 64: 256.0}})


def stopping_drafters():
    return {
        "token-recycling": TokenRecyclingDrafter(successors=3, max_nodes=8, cost_curve=STOPS_AT_40),
        "suffix": SuffixDrafter(min_match=1, max_nodes=8, cost_curve=STOPS_AT_40),
        "multi": MultiDrafter([TokenRecyclingDrafter(successors=3, max_nodes=6, budget=False),
                               PromptLookupDrafter(max_ngram=2, max_depth=4)],
                              max_nodes=10, cost_curve=STOPS_AT_40),
    }


@pytest.mark.parametrize("name", ["token-recycling", "suffix", "multi"])
def test_trees_stop_where_the_context_makes_them_too_dear_and_the_output_holds(name):
    model = tiny_model("llama", vocab=48, layers=2, seed=5)
    prompts = [[1, 2, 3, 1, 2], [3, 3, 3, 3, 3, 3, 3, 3, 3]]
    for prompt in prompts:
        want = generate(model, [prompt], max_new_tokens=50, eos_token_id=[]).tokens[0]
        drafter = stopping_drafters()[name]
        widths = RecordedWidths(drafter)
        out = generate(model, [prompt], drafter=drafter, max_new_tokens=50, eos_token_id=[])
        assert out.tokens[0] == want, (name, prompt)
        assert any(w > 1 for c, w in widths.seen if c < 20), (name, widths.seen)
        assert all(w == 1 for c, w in widths.seen if c >= 40), (name, widths.seen)
        assert any(c >= 40 for c, _ in widths.seen)


def test_a_ragged_batch_costs_its_shared_block_at_the_mean_context():
    model = tiny_model("llama", vocab=48, layers=2, seed=5)
    prompts = [[1, 2, 3, 1, 2], [4] * 30]
    want = [generate(model, [p], max_new_tokens=12, eos_token_id=[]).tokens[0] for p in prompts]
    drafter = stopping_drafters()["multi"]
    widths = RecordedWidths(drafter)
    out = generate(model, prompts, drafter=drafter, max_new_tokens=12, eos_token_id=[])
    assert out.tokens == want
    first_context, _ = widths.seen[0]
    assert first_context == (4 + 29) / 2  # cached: each prompt but its last token (pending)

