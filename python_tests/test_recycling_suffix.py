"""Training-free prophets (issue 25): the suffix automaton against brute force on random token
streams, the suffix memory's bound and isolation, the successor table's update and walk
against plain-Python references, bad options; token recycling, suffix drafting and the merged
drafter with both: greedy identity with Hugging Face ``generate`` at batch 1 and 4 (ragged),
a request's sampled output independent of its batch, and lossless sampling (chi-square,
tiny models)."""

import json
import random

import pytest
import torch

from python_tests.decoding_helpers import dev_prompts, hf_greedy, tiny_model
from python_tests.test_decoding_sampling import (
    CONFIGS,
    PROMPT,
    VOCAB,
    assert_follows_target,
    exact_distribution,
    run_batch,
)
from specdec_kernels.decoding import (
    MultiDrafter,
    PromptLookupDrafter,
    SuffixDrafter,
    SuffixMemory,
    TokenRecyclingDrafter,
    generate,
    make_drafter,
)
from specdec_kernels.decoding.suffix_automaton import Matcher, SuffixAutomaton
from specdec_kernels.decoding.token_recycling import SuccessorTable, prompt_successors

# ---------------------------------------------------------------------------- suffix automaton


def occurrences(documents, pattern):
    """End positions (in the documents laid end to end) of every occurrence of ``pattern``."""
    ends, offset = [], 0
    for doc in documents:
        for end in range(len(pattern), len(doc) + 1):
            if doc[end - len(pattern) : end] == pattern:
                ends.append(offset + end - 1)
        offset += len(doc)
    return ends


def random_documents(rng, vocab, count, longest):
    return [[rng.randrange(vocab) for _ in range(rng.randint(0, longest))] for _ in range(count)]


def automaton_of(documents):
    sam = SuffixAutomaton()
    for doc in documents:
        sam.start_document()
        sam.extend(doc)
    return sam


@pytest.mark.parametrize("seed", range(40))
def test_automaton_counts_every_substring_like_brute_force(seed):
    rng = random.Random(seed)
    documents = random_documents(rng, rng.choice([1, 2, 3, 7, 30]), rng.randint(1, 4), 29)
    sam = automaton_of(documents)
    total = sum(map(len, documents))
    assert sam.tokens == [t for doc in documents for t in doc]
    assert len(sam) <= max(2 * total - 1, 1) + 1  # root + at most 2n - 1 states
    substrings = {tuple(doc[i:j]) for doc in documents for i in range(len(doc))
                  for j in range(i + 1, min(len(doc), i + 8) + 1)}
    for pattern in substrings:
        state = sam.walk(pattern)
        ends = occurrences(documents, list(pattern))
        assert state is not None and sam.count[state] == len(ends), pattern
        assert sam.last_end[state] == max(ends), pattern
    for _ in range(30):
        pattern = tuple(rng.randrange(31) for _ in range(rng.randint(1, 4)))
        assert (sam.walk(pattern) is None) == (pattern not in substrings)


@pytest.mark.parametrize("seed", range(30))
def test_repeated_suffix_is_the_longest_earlier_match(seed):
    rng = random.Random(100 + seed)
    vocab = rng.choice([2, 3, 5, 12])
    sam, text = SuffixAutomaton(), []
    for _ in range(rng.randint(1, 60)):
        token = rng.randrange(vocab)
        sam.append(token)
        text.append(token)
        want = next((m for m in range(len(text) - 1, 0, -1)
                     if len(occurrences([text], text[-m:])) >= 2), 0)
        state, length = sam.repeated_suffix()
        assert length == want
        if want:
            assert sam.walk(text[-want:]) == state


@pytest.mark.parametrize("seed", range(30))
def test_matcher_finds_the_longest_suffix_in_the_documents(seed):
    rng = random.Random(200 + seed)
    vocab = rng.choice([2, 4, 9])
    documents = random_documents(rng, vocab, rng.randint(1, 3), 25)
    sam = automaton_of(documents)
    stream = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
    matcher = Matcher(sam)
    for i, token in enumerate(stream):
        matcher.extend([token])
        seen = stream[: i + 1]
        want = next((m for m in range(len(seen), 0, -1)
                     if occurrences(documents, seen[-m:])), 0)
        assert matcher.length == want
        if want:
            assert sam.walk(seen[-want:]) == matcher.state
    assert Matcher(sam, stream).length == matcher.length


def test_continuations_follow_the_counts():
    # After [1, 2]: 3 four times (then 4 three times and 5 once), 6 twice.
    text = [1, 2, 3, 4] * 3 + [1, 2, 3, 5, 1, 2, 6, 0, 1, 2, 6, 9, 1, 2]
    sam = automaton_of([text])
    state, length = sam.repeated_suffix()
    assert length == 2
    found = sam.continuations(state, max_nodes=5, max_depth=3, max_branches=2)
    assert found.tokens[:4] == [3, 4, 1, 6] and found.parents[:4] == [-1, 0, 1, -1]
    assert found.probs[:4] == pytest.approx([4 / 6, 4 / 6 * 3 / 4, 4 / 6 * 3 / 4, 2 / 6])
    assert found.ranks[:4] == [0, 0, 0, 1] and found.depths[:4] == [1, 2, 3, 1]
    assert all(found.parents[i] < i for i in range(len(found)))
    assert sam.continuations(state, 9, 1).tokens == [3, 6]  # depth-limited
    assert sam.continuations(state, 9, 3, min_probability=0.5).tokens == [3, 4, 1]


# ---------------------------------------------------------------------------- memory


def test_memory_holds_its_bound_and_drops_the_least_recently_used():
    memory = SuffixMemory(max_tokens=40)
    for i in range(12):
        memory.add([i] * 7)
        assert memory.num_tokens <= 40
        assert len(memory.automaton.tokens) == memory.num_tokens
        assert len(memory.automaton) <= 2 * memory.num_tokens
    held = {tuple(d) for d in memory._documents.values()}
    assert (11,) * 7 in held and (0,) * 7 not in held
    # Touching an output keeps it through the next eviction: the untouched go first.
    memory.clear()
    for i in range(5):
        memory.add([i] * 7)
    memory.touch(memory.automaton.tokens.index(0))
    memory.add([5] * 7)  # 42 tokens: down to 3/4 of the bound, least recently used first
    assert [d[0] for d in memory._documents.values()] == [3, 4, 0, 5]
    assert sorted(set(memory.automaton.tokens)) == [0, 3, 4, 5]
    memory.add(list(range(100)))  # longer than the bound: its end is kept
    assert memory.num_tokens <= 40 and memory.automaton.tokens[-1] == 99
    memory.clear()
    assert memory.num_tokens == 0 and len(memory.automaton) == 1


# ---------------------------------------------------------------------------- successor table


class ReferenceTable:
    """The successor table of one request in plain Python (the hash of pairs shared)."""

    def __init__(self, table: SuccessorTable, prompt: list):
        fallback, singles, pairs = prompt_successors(prompt, table.k, table.vocab_size)
        self.hash = table
        self.single = {v: singles.get((v,), fallback) for v in range(table.vocab_size)}
        self.pair = {}
        for (u, v), row in pairs.items():
            self.pair[self.slot(u, v)] = ((u, v), row)

    def slot(self, u, v):
        return int(self.hash._pair(torch.tensor(u), torch.tensor(v))[1])

    def row(self, before, last):
        if before >= 0:
            held = self.pair.get(self.slot(before, last))
            if held is not None and held[0] == (before, last):
                return held[1]
        return self.single[last]

    def update(self, tokens, parents, top, accepted, root_before):
        """Rows written in increasing priority (other rows, then the accepted path; within
        each, in row order), so the accepted and then the later rows win."""
        for j in [j for j in range(len(tokens)) if j not in accepted] + sorted(accepted):
            if tokens[j] < 0:
                continue
            self.single[tokens[j]] = top[j]
            before = tokens[parents[j]] if parents[j] >= 0 else root_before
            if before >= 0:
                self.pair[self.slot(before, tokens[j])] = ((before, tokens[j]), top[j])

    def walk(self, root, root_before, parents, ranks):
        tokens, before = [root], [root_before]
        for j in range(1, len(parents)):
            if parents[j] < 0:
                tokens.append(root)
                before.append(root_before)
                continue
            p = parents[j]
            tokens.append(self.row(before[p], tokens[p])[ranks[j]])
            before.append(tokens[p])
        return tokens


@pytest.mark.parametrize("slots", [1 << 14, 4])  # 4 slots: collisions all the time
@pytest.mark.parametrize("seed", range(4))
def test_successor_table_update_and_walk_match_python(seed, slots):
    gen = torch.Generator().manual_seed(seed)
    vocab, k, batch, width = 11, 3, 2, 9
    table = SuccessorTable(vocab, k, "cpu", pair_slots=slots)
    prompts = [[1, 2, 3, 2, 4, 2, 3, 1], [5]]
    table.start(prompts)
    mirror = [ReferenceTable(table, p) for p in prompts]
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3, 2, 6, 0], [-1, 0, 1, 2, 0, 4, -2, -2, -2]])
    for _ in range(4):
        tokens = torch.randint(0, 4, (batch, width), generator=gen)  # many repeats
        tokens[1, 6:] = -1  # unused rows
        logits = torch.randn(batch, width + 2, vocab, generator=gen)
        accepted = torch.tensor([[0, 1, 4, -1], [0, 4, 5, -1]])
        before = torch.randint(-1, 4, (batch,), generator=gen)
        table.update(tokens, parents, logits, accepted, before)
        top = logits.topk(k, -1).indices.tolist()
        for b in range(batch):
            mirror[b].update(tokens[b].tolist(), parents[b].tolist(), top[b],
                             [r for r in accepted[b].tolist() if r >= 0], int(before[b]))
    for b in range(batch):
        assert table.single[b, :vocab].tolist() == [mirror[b].single[v] for v in range(vocab)]
    tree = torch.tensor([[-1, 0, 0, 1, 3, 2, -2], [-1, 0, 1, 2, -2, -2, -2]])
    ranks = torch.tensor([[0, 0, 2, 1, 0, 1, 0], [0, 1, 2, 0, 0, 0, 0]])
    depths = torch.tensor([[0, 1, 1, 2, 3, 2, -1], [0, 1, 2, 3, -1, -1, -1]])
    roots, before = torch.tensor([2, 7]), torch.tensor([3, -1])
    walked = table.walk(roots, before, tree, ranks, depths, 3).tolist()
    for b in range(batch):
        assert walked[b] == mirror[b].walk(int(roots[b]), int(before[b]), tree[b].tolist(),
                                           ranks[b].tolist())


def test_prompt_successors_are_distinct_and_most_recent_first():
    fallback, singles, pairs = prompt_successors([4, 1, 4, 2, 4, 1, 4, 3], 3, 10)
    assert fallback == [4, 1, 2]
    assert singles == {(4,): [3, 1, 2], (1,): [4, 1, 2], (2,): [4, 1, 2]}
    assert pairs == {(4, 2): [4, 1, 2], (2, 4): [1, 3, 2], (4, 1): [4, 1, 2], (1, 4): [3, 2, 1]}
    assert list(pairs) == [(4, 2), (2, 4), (4, 1), (1, 4)]  # by last occurrence
    assert prompt_successors([5], 3, 10) == ([5, 0, 1], {}, {})


# ---------------------------------------------------------------------------- bad options


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="successors must be >= 1, got 0"):
        TokenRecyclingDrafter(successors=0)
    with pytest.raises(ValueError, match="successors must be <= 64, got 65 .MAX_SUCCESSORS"):
        TokenRecyclingDrafter(successors=65)
    with pytest.raises(ValueError, match="max_nodes must be <= 255, got 300 .a verification"):
        TokenRecyclingDrafter(max_nodes=300)
    with pytest.raises(ValueError, match="max_depth must be an integer, got 2.5"):
        TokenRecyclingDrafter(max_depth=2.5)
    with pytest.raises(ValueError, match="min_match must be >= 1, got 0"):
        SuffixDrafter(min_match=0)
    with pytest.raises(ValueError, match="max_branches must be <= 255"):
        SuffixDrafter(max_branches=1000)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="depth_per_match must be a number > 0"):
            SuffixDrafter(depth_per_match=bad)
    with pytest.raises(ValueError, match="memory must be a SuffixMemory"):
        SuffixDrafter(memory=[1, 2, 3])
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        SuffixMemory(max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be <= 4194304"):
        SuffixMemory(max_tokens=1 << 30)
    with pytest.raises(ValueError, match="memory: only the suffix prophet"):
        make_drafter("multi", prophets="token-recycling", memory=SuffixMemory())
    with pytest.raises(ValueError, match="prophets: cannot merge"):
        make_drafter("multi", prophets="suffix,bogus")
    with pytest.raises(ValueError, match="successors: 20 exceeds the vocabulary of 13"):
        generate(tiny_model(vocab=13, layers=1), [[1, 2]], max_new_tokens=2,
                 drafter=TokenRecyclingDrafter(successors=20))


# ---------------------------------------------------------------------------- tiny models

TINY_VOCAB = 13
TINY_PROMPTS = [[1, 2, 3, 1, 2], [4], [5, 6, 7, 8, 9, 10, 11], [3, 3, 3, 3, 3, 3, 3, 3, 3], [2, 9]]
FLAT_COST = {1: 1.0, 16: 1.0, 64: 4.0}  # width is cheap: the budgets draft freely


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", vocab=TINY_VOCAB, layers=2, seed=5)


@pytest.fixture(scope="module")
def tiny_memory(tiny):
    """A memory holding the tiny target's own greedy continuations of other prompts."""
    rng = random.Random(1)
    memory = SuffixMemory(max_tokens=400)
    for _ in range(10):
        prompt = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(2, 6))]
        memory.add(prompt + hf_greedy(tiny, prompt, 20))
    return memory


def tiny_drafter(name, memory=None):
    if name == "token-recycling":
        return TokenRecyclingDrafter(successors=3, max_nodes=8, cost_curve=FLAT_COST)
    if name == "suffix":
        return SuffixDrafter(min_match=1, max_nodes=8, cost_curve=FLAT_COST)
    if name == "suffix-memory":
        return SuffixDrafter(memory=memory, min_match=1, max_nodes=8, cost_curve=FLAT_COST)
    if name == "multi":
        return MultiDrafter(
            [TokenRecyclingDrafter(successors=3, max_nodes=6, budget=False),
             SuffixDrafter(memory=memory, min_match=1, max_nodes=6, budget=False),
             PromptLookupDrafter(max_ngram=3, max_depth=4)],
            max_nodes=10, cost_curve=FLAT_COST,
        )
    raise ValueError(name)


TINY_DRAFTERS = ["token-recycling", "suffix", "suffix-memory", "multi"]


def frozen(memory):
    """A copy of the memory that the run may grow without touching the fixture's."""
    copy = SuffixMemory(memory.max_tokens)
    for doc in memory._documents.values():
        copy.add(doc)
    return copy


@pytest.mark.parametrize("cpu_kernels", [False, True])
@pytest.mark.parametrize("name", TINY_DRAFTERS)
def test_tiny_greedy_matches_hf_generate_batch_1_and_4(tiny, tiny_memory, name, cpu_kernels):
    want = [hf_greedy(tiny, p, 19) for p in TINY_PROMPTS]
    if cpu_kernels:  # the package's kernels: its own autoregressive output is the reference
        want = [generate(tiny, [p], max_new_tokens=19, eos_token_id=[]).tokens[0]
                for p in TINY_PROMPTS]
    forwards = emitted = 0
    for p, w in zip(TINY_PROMPTS, want):
        out = generate(tiny, [p], drafter=tiny_drafter(name, frozen(tiny_memory)),
                       max_new_tokens=19, eos_token_id=[], cpu_kernels=cpu_kernels)
        assert out.tokens[0] == w, (name, p)
        forwards += out.stats.target_forwards
        emitted += out.stats.new_tokens
    assert emitted / forwards > 1.2, (name, emitted / forwards)  # drafts were accepted
    out = generate(tiny, TINY_PROMPTS[:4], drafter=tiny_drafter(name, frozen(tiny_memory)),
                   max_new_tokens=[19, 7, 19, 13], eos_token_id=[], cpu_kernels=cpu_kernels)
    assert out.tokens == [w[:n] for w, n in zip(want[:4], [19, 7, 19, 13])], name
    if name == "multi":
        prophets = out.stats.drafter_report["prophets"]
        assert prophets["token-recycling"]["drafts_accepted"] > 0
        assert prophets["suffix"]["drafts_accepted"] > 0


class CheckedRecycling(TokenRecyclingDrafter):
    """Token recycling that counts its template choices and checks, before every proposal,
    that each request's kept template is the one a fresh choice would give."""

    choices = 0

    def start(self, state):
        super().start(state)
        self.table_at_start = self.table.single.clone()

    def template(self, stats, remaining, context=None):
        self.choices += 1
        return super().template(stats, remaining, context)

    def propose(self, state):
        for b, (left, context) in enumerate(zip(state.remaining, state.starts)):
            kept = self._template_of(b, left, context)
            fresh = TokenRecyclingDrafter.template(self, self._stats[b], left, context)
            assert (kept.parents, kept.ranks) == (fresh.parents, fresh.ranks), (b, left)
        return super().propose(state)


@pytest.mark.parametrize("cost, drafts", [(FLAT_COST, True), ({1: 1.0, 2: 50.0}, False)])
def test_recycling_chooses_its_template_again_only_when_its_statistics_move(tiny, cost, drafts):
    """Where the cost model keeps the tree, every step's template is what a fresh choice gives;
    where nothing pays (a second row costs 50 first rows), nothing is drafted, nothing is
    recorded, the template is chosen once per depth limit (2 here: depth 2, then 1 and 0 in
    the last steps), not once a step, and the table, never to be read, is not updated."""
    want = [generate(tiny, [p], max_new_tokens=19, eos_token_id=[]).tokens[0] for p in TINY_PROMPTS]
    for prompt, expected in zip(TINY_PROMPTS, want):
        drafter = CheckedRecycling(successors=3, max_nodes=8, max_depth=2, cost_curve=cost)
        out = generate(tiny, [prompt], drafter=drafter, max_new_tokens=19, eos_token_id=[],
                       cpu_kernels=True)
        assert out.tokens[0] == expected, prompt
        steps = out.stats.target_forwards
        updated = not torch.equal(drafter.table.single, drafter.table_at_start)
        if drafts:
            assert steps < 19 and updated, prompt
        else:
            assert steps == 19 and drafter._stats[0].records == 0 and not updated, prompt
            # Each proposal's check above makes one fresh choice; the drafter's own are the rest.
            assert drafter.choices - steps <= 3, (prompt, drafter.choices - steps)


# Not the merged drafter: its budget sizes one block for the whole batch (MultiDrafter).
@pytest.mark.parametrize("name", ["token-recycling", "suffix", "suffix-memory"])
def test_a_request_does_not_depend_on_its_batch(tiny, tiny_memory, name):
    """Same seed, same sampled output, whether the request runs alone or among others: each
    request's table, statistics and tree are its own, and the memory is read-only in a run."""
    prompts = [TINY_PROMPTS[0], TINY_PROMPTS[2], TINY_PROMPTS[4]]
    kwargs = dict(max_new_tokens=14, temperature=1.0, eos_token_id=[])
    together = generate(tiny, prompts, drafter=tiny_drafter(name, frozen(tiny_memory)),
                        seed=[5, 6, 7], **kwargs)
    for i, prompt in enumerate(prompts):
        alone = generate(tiny, [prompt], drafter=tiny_drafter(name, frozen(tiny_memory)),
                         seed=[5 + i], **kwargs)
        assert alone.tokens[0] == together.tokens[i], (name, i)


def test_memory_is_used_only_when_given_and_grows_after_the_run(tiny):
    prompt, other = [1, 2, 3, 1, 2], [7, 4, 2, 9]
    memory = SuffixMemory(max_tokens=64)
    first = generate(tiny, [other], drafter=SuffixDrafter(memory=memory, min_match=1),
                     max_new_tokens=20, eos_token_id=[])
    assert memory.num_documents == 1 and list(memory.automaton.tokens) == first.tokens[0]
    # Without the memory nothing of the first run reaches the next one.
    fresh = generate(tiny, [other], drafter=SuffixDrafter(min_match=1), max_new_tokens=20,
                     eos_token_id=[])
    assert fresh.stats.drafter_report["accepted_from_memory"] == 0
    assert "memory" not in fresh.stats.drafter_report
    # With it, the same request drafts its whole output from the earlier one.
    again = generate(tiny, [other], drafter=SuffixDrafter(memory=memory, min_match=1),
                     max_new_tokens=20, eos_token_id=[])
    report = again.stats.drafter_report
    assert again.tokens == first.tokens and report["accepted_from_memory"] >= 10
    assert again.stats.tau > fresh.stats.tau
    # A batch reads the memory as it was when the run started, and adds in request order.
    before = memory.num_documents
    out = generate(tiny, [prompt, other], drafter=SuffixDrafter(memory=memory, min_match=1),
                   max_new_tokens=6, eos_token_id=[])
    assert memory.num_documents == before + 2
    assert list(memory._documents.values())[-2:] == [tuple(t) for t in out.tokens]


@pytest.fixture(scope="module")
def sampling_target():
    return tiny_model("llama", vocab=VOCAB, layers=3, seed=11)


@pytest.mark.parametrize("name", ["token-recycling", "suffix-memory", "multi"])
def test_sampling_follows_the_target_distribution(sampling_target, name):
    target = sampling_target
    exact = [exact_distribution(target, c) for c in CONFIGS]
    memory = SuffixMemory(max_tokens=200)  # sequences over the tiny vocabulary
    rng = random.Random(4)
    for _ in range(4):
        memory.add([rng.randrange(VOCAB) for _ in range(30)])
    memory.add(PROMPT + [0, 4, 3, 1, 2])
    drafter = {
        "token-recycling": TokenRecyclingDrafter(successors=3, max_nodes=6, cost_curve=FLAT_COST),
        "suffix-memory": SuffixDrafter(memory=memory, min_match=1, max_nodes=6,
                                       cost_curve=FLAT_COST),
        "multi": MultiDrafter(
            [TokenRecyclingDrafter(successors=3, max_nodes=6, budget=False),
             SuffixDrafter(memory=memory, min_match=1, max_nodes=6, budget=False)],
            max_nodes=8, cost_curve=FLAT_COST),
    }[name]
    out = run_batch(target, drafter)
    assert_follows_target(out, exact, f"{name}, ")
    assert out.stats.tau > 1.05


# ---------------------------------------------------------------------------- default model

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def prompts(loaded):
    from specdec_kernels.models import encode_prompts

    return encode_prompts(loaded.tokenizer, dev_prompts()[:8])


@pytest.fixture(scope="module")
def expected(loaded, prompts):
    """The package's own greedy output (CPU kernels; equals HF's but for near ties, which
    test_decoding_greedy checks)."""
    return [generate(loaded, [p], max_new_tokens=NEW_TOKENS).tokens[0] for p in prompts]


@pytest.mark.default_model
@pytest.mark.parametrize("name", ["token-recycling", "suffix", "multi-both"])
def test_default_model_greedy_identity_batch_1_and_4(loaded, prompts, expected, name):
    def drafter():
        if name == "multi-both":
            return make_drafter("multi", prophets="suffix,token-recycling,prompt-lookup")
        return make_drafter(name)

    forwards = emitted = 0
    for p, want in zip(prompts[:4], expected):
        out = generate(loaded, [p], drafter=drafter(), max_new_tokens=NEW_TOKENS)
        assert out.tokens[0] == want, name
        forwards += out.stats.target_forwards
        emitted += out.stats.new_tokens
    assert emitted / forwards > 1.0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))[::2]
    out = generate(loaded, [prompts[i] for i in order], drafter=drafter(),
                   max_new_tokens=NEW_TOKENS)
    assert out.tokens == [expected[i] for i in order], name


# ---------------------------------------------------------------------------- command line


@pytest.mark.default_model
@pytest.mark.parametrize("drafter, extra", [
    ("token-recycling", ["--successors", "4", "--max-nodes", "12"]),
    ("suffix", ["--min-match", "2", "--depth-per-match", "2"]),
    ("multi", ["--prophets", "suffix,token-recycling"]),
])
def test_cli_generate_runs_the_new_drafters(capsys, loaded, drafter, extra):
    from specdec_kernels import cli

    assert cli.main(["generate", "--drafter", drafter, *extra, "--max-new-tokens", "6",
                     "--json", "Count: one two three, one two three,"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["method"] == drafter and len(out["tokens"][0]) == 6
    if drafter != "multi":
        settings = out["stats"]["drafter"]
        assert all(str(settings[k.lstrip("-").replace("-", "_")]) in (v, str(float(v)))
                   for k, v in zip(extra[::2], extra[1::2]))


@pytest.mark.parametrize("argv, message", [
    (["generate", "--drafter", "suffix", "--successors", "3", "x"],
     "--successors does not apply to --drafter suffix"),
    (["generate", "--drafter", "token-recycling", "--min-match", "3", "x"],
     "--min-match does not apply to --drafter token-recycling"),
    (["bench", "--memory-tokens", "100"],
     "--series-length and --memory-tokens apply to --workload repeated-task only"),
    (["bench", "--workload", "repeated-task", "--categories", "qa"],
     "--prompts-file, --categories and --all-prompts choose dev prompts; --workload "
     "repeated-task makes its own series"),
    (["bench", "--workload", "repeated-task", "--series-length", "1"],
     "argument --series-length: must be >= 2, got 1"),
    (["generate", "--drafter", "suffix", "--depth-per-match", "0", "x"],
     "argument --depth-per-match: must be in (0, inf), got 0"),
])
def test_cli_bad_options_exit_2(argv, message, capsys):
    from specdec_kernels import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Loading weights" not in err


def test_repeated_task_series_is_generated_not_taken_from_the_benchmark():
    from specdec_kernels.bench.prompts import SERIES_HALVES, repeated_task_prompts
    from specdec_kernels.data import load_prompts

    series = repeated_task_prompts(10)
    assert series == repeated_task_prompts(10)  # deterministic
    assert [p.question_id for p in series] == list(range(1, 11))
    assert [p.category for p in series] == [SERIES_HALVES[0]] * 5 + [SERIES_HALVES[1]] * 5
    instruction = series[0].text.split("\n\n")[0]
    assert all(p.text.startswith(instruction) for p in series)
    assert len({p.text for p in series}) == 10
    dev = {row["turns"][0] for row in load_prompts()}
    assert not dev & {p.text for p in series}


@pytest.mark.default_model
def test_bench_repeated_task_keeps_a_memory_per_method(tmp_path, loaded):
    from specdec_kernels import cli

    out = tmp_path / "bench"
    assert cli.main(["bench", "--workload", "repeated-task", "--series-length", "3",
                     "--max-new-tokens", "12", "--methods",
                     "hf-generate,ours-autoregressive,ours-suffix", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["config"]["workload"] == "repeated-task"
    runs = sorted((m for m in result["measurements"] if m["method"] == "ours-suffix"),
                  key=lambda m: m["question_ids"])
    # The memory starts empty (the warm-up forgotten) and holds the earlier outputs.
    held = [m["drafter_report"]["memory"]["documents"] for m in runs]
    assert held == [0, 1, 2]  # reported before the run adds its own output
    assert all(m["identical"] for m in result["measurements"])
    text = (out / "results.md").read_text()
    assert "τ by position in the series" in text and "series_2nd_half" in text
