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
    NEW,
    PER_CONFIG,
    PROMPT,
    VOCAB,
    chi_square_pvalue,
    counts_of,
    exact_distribution,
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


def reference_update(table, tokens, top, accepted):
    """Plain Python: rows written in increasing priority (other rows, then the accepted
    path; within each, in row order), so the accepted and later rows win."""
    order = [j for j in range(len(tokens)) if j not in accepted] + sorted(accepted)
    for j in order:
        if tokens[j] >= 0:
            table[tokens[j]] = top[j]


@pytest.mark.parametrize("seed", range(5))
def test_successor_table_update_and_walk_match_python(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab, k, batch, width = 11, 3, 2, 9
    table = SuccessorTable(vocab, k, "cpu")
    prompts = [[1, 2, 3, 2, 4], [5]]
    table.start(prompts)
    mirror = []
    for prompt in prompts:
        fallback, rows = prompt_successors(prompt, k, vocab)
        mirror.append({v: rows.get(v, fallback) for v in range(vocab)})
    for _ in range(4):
        tokens = torch.randint(0, 4, (batch, width), generator=gen)  # many repeats
        tokens[1, 6:] = -1  # unused rows
        logits = torch.randn(batch, width + 2, vocab, generator=gen)
        accepted = torch.tensor([[0, 3, 5, -1], [0, 2, -1, -1]])
        table.update(tokens, logits, accepted)
        top = logits.topk(k, -1).indices.tolist()
        for b in range(batch):
            reference_update(mirror[b], tokens[b].tolist(), top[b],
                             [r for r in accepted[b].tolist() if r >= 0])
    for b in range(batch):
        assert table.table[b, :vocab].tolist() == [mirror[b][v] for v in range(vocab)]
    parents = torch.tensor([[-1, 0, 0, 1, 3, -2], [-1, 0, 1, -2, -2, -2]])
    ranks = torch.tensor([[0, 0, 2, 1, 0, 0], [0, 1, 2, 0, 0, 0]])
    depths = torch.tensor([[0, 1, 1, 2, 3, -1], [0, 1, 2, -1, -1, -1]])
    roots = torch.tensor([2, 7])
    walked = table.walk(roots, parents, ranks, depths).tolist()
    for b in range(batch):
        want = [int(roots[b])]
        for j in range(1, 6):
            p = int(parents[b, j])
            want.append(mirror[b][want[p]][int(ranks[b, j])] if p >= 0 else int(roots[b]))
        assert walked[b] == want


def test_prompt_successors_are_distinct_and_most_recent_first():
    fallback, rows = prompt_successors([4, 1, 4, 2, 4, 1, 4, 3], 3, 10)
    assert fallback == [4, 1, 2]
    assert rows == {4: [3, 1, 2], 1: [4, 1, 2], 2: [4, 1, 2]}
    assert prompt_successors([5], 3, 10) == ([5, 0, 1], {})


# ---------------------------------------------------------------------------- bad options


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="successors, max_nodes and max_depth must be >= 1"):
        TokenRecyclingDrafter(successors=0)
    with pytest.raises(ValueError, match="max_depth, min_match, max_nodes and max_branches"):
        SuffixDrafter(min_match=0)
    with pytest.raises(ValueError, match="depth_per_match must be > 0"):
        SuffixDrafter(depth_per_match=0)
    with pytest.raises(ValueError, match="memory must be a SuffixMemory"):
        SuffixDrafter(memory=[1, 2, 3])
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        SuffixMemory(max_tokens=0)
    with pytest.raises(ValueError, match="memory: only the suffix prophet"):
        make_drafter("multi", prophets="token-recycling", memory=SuffixMemory())
    with pytest.raises(ValueError, match="prophets: cannot merge"):
        make_drafter("multi", prophets="suffix,bogus")
    with pytest.raises(ValueError, match="successors: 20 exceeds the vocabulary of 13"):
        generate(tiny_model(vocab=13, layers=1), [[1, 2]], max_new_tokens=2,
                 drafter=TokenRecyclingDrafter(successors=20))
