"""Several prophets (issue 14): the retrieval datastore against a brute-force scan, the
cost-model budget against an exhaustive search, bad input, and the retrieval, quantized-self
and merged drafters: greedy identity with Hugging Face ``generate`` at batch 1 and 4 (tiny
models, and the default model with its shipped datastore and heads), lossless sampling of the
merged tree (chi-square, tiny models)."""

import itertools
import json
import random

import numpy as np
import pytest
import torch

from python_tests.decoding_helpers import (
    dev_prompts,
    hf_greedy,
    random_heads,
    tiny_model,
    truncated_copy,
)
from python_tests.test_decoding_sampling import (
    CONFIGS,
    PROMPT,
    VOCAB,
    assert_follows_target,
    exact_distribution,
    run_batch,
)
from specdec_kernels.decoding import (
    MedusaDrafter,
    MultiDrafter,
    PromptLookupDrafter,
    QuantizedSelfDrafter,
    RetrievalDrafter,
    generate,
    make_drafter,
)
from specdec_kernels.decoding.budget import (
    AcceptanceStats,
    CandidateTree,
    TreeBudget,
    path_probabilities,
)
from specdec_kernels.decoding.retrieval import frequency_trie
from specdec_kernels.retrieval import Datastore, build_datastore
from specdec_kernels.training.retrieval_corpus import read_corpus

# ---------------------------------------------------------------------------- datastore


def brute_force(documents, context, max_suffix, depth):
    """The longest suffix of ``context`` occurring in a document, and every continuation."""
    for length in range(min(max_suffix, len(context)), 0, -1):
        suffix = list(context[-length:])
        found = []
        for doc in documents:
            for end in range(length, len(doc) + 1):
                if doc[end - length : end] == suffix:
                    found.append(tuple(doc[end : end + depth]))
        if found:
            return length, found
    return 0, []


def store_of(tmp_path, documents, vocab, name="store"):
    build_datastore(documents, tmp_path / name, fingerprint={"vocab_size": vocab})
    return Datastore(tmp_path / name)


@pytest.mark.parametrize("vocab, docs, seed", [(3, 5, 0), (7, 3, 1), (50, 9, 2), (2, 1, 3)])
def test_lookup_matches_a_brute_force_scan(tmp_path, vocab, docs, seed):
    rng = random.Random(seed)
    documents = [[rng.randrange(vocab) for _ in range(rng.randint(1, 37))] for _ in range(docs)]
    store = store_of(tmp_path, documents, vocab)
    assert store.meta["num_tokens"] == sum(map(len, documents))
    for _ in range(60):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 21))]
        max_suffix, depth = rng.choice([1, 3, 5, 16]), rng.choice([1, 2, 5])
        want_len, want = brute_force(documents, context, max_suffix, depth)
        got = store.lookup(context, depth, max_suffix=max_suffix, max_matches=10**6)
        assert got.suffix_length == want_len
        assert got.matches == len(want)
        assert sorted(got.continuations) == sorted(c for c in want if c)


def test_lookup_samples_spread_matches_and_respects_min_suffix(tmp_path):
    documents = [[1, 2, 3 + (i % 4)] for i in range(100)]
    store = store_of(tmp_path, documents, 10)
    got = store.lookup([9, 1, 2], 1, max_matches=8)
    assert got.suffix_length == 2 and got.matches == 100 and len(got.continuations) == 8
    assert len(set(got.continuations)) == 4  # evenly spread, every continuation seen
    assert store.lookup([9, 9, 2], 1, min_suffix=2).continuations == []


def test_numpy_suffix_array_agrees_with_pydivsufsort():
    from specdec_kernels.retrieval.datastore import _numpy_suffix_array, _suffix_array

    rng = np.random.default_rng(0)
    for n, vocab in [(1, 3), (17, 2), (200, 5), (301, 1000)]:
        tokens = rng.integers(0, vocab, n).astype(np.int32)
        assert _numpy_suffix_array(tokens).tolist() == _suffix_array(tokens).tolist()


def test_frequency_trie_keeps_the_most_frequent_prefixes():
    conts = [(1, 2, 3)] * 5 + [(1, 4)] * 3 + [(5,)] * 2
    tree = frequency_trie(9, conts, 4, "r")  # counts: 1: 8, 12: 5, 123: 5, 14: 3, 5: 2
    assert tree.tokens == [9, 1, 2, 4, 3] and tree.parents == [-1, 0, 1, 1, 2]
    assert [tree.sources[j]["r"] for j in range(1, 5)] == [0, 0, 1, 0]
    tree = frequency_trie(9, conts, 5, "r")
    assert tree.tokens == [9, 1, 5, 2, 4, 3] and tree.sources[2]["r"] == 1


def test_a_self_distillation_cache_is_a_corpus_of_its_greedy_answers(tmp_path):
    """``specdec datastore build CACHE``: the greedy answers of every stage, in stage and
    chunk order; sampled answers and folders that are not caches are left out."""
    from safetensors.torch import save_file

    cache = tmp_path / "cache"
    chunks = {("first", 0): (["a", "b"], [0, 1]), ("first", 1): (["c"], [0]),
              ("self", 0): (["d", "e"], [0, 0])}
    for (stage, index), (answers, sampled) in chunks.items():
        path = cache / stage / f"chunk_{index:04d}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"sampled": torch.tensor(sampled, dtype=torch.uint8),
                   "features": torch.zeros(2, 3)}, str(path))
        path.with_suffix(".json").write_text(json.dumps({"prompts": answers, "answers": answers}))
    (cache / "manifest.json").write_text(json.dumps({"layers": [2, "final_norm"]}))
    (tmp_path / "notes.txt").write_text("f")
    assert read_corpus([cache, tmp_path / "notes.txt"]) == ["a", "c", "d", "e", "f"]
    with pytest.raises(ValueError, match="is a folder but no self-distillation cache"):
        read_corpus([tmp_path])


# ---------------------------------------------------------------------------- bad input


def test_empty_corpus_is_refused(tmp_path):
    with pytest.raises(ValueError, match="documents: the corpus is empty"):
        build_datastore([[], []], tmp_path / "s", fingerprint={"vocab_size": 5})
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="corpus: .* hold no text"):
        read_corpus([tmp_path / "empty.txt"])
    with pytest.raises(ValueError, match="corpus: give at least one"):
        read_corpus([])
    (tmp_path / "bad.jsonl").write_text(json.dumps({"title": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1 has none of the fields"):
        read_corpus([tmp_path / "bad.jsonl"])


def test_datastore_for_another_tokenizer_is_refused(tmp_path):
    store = store_of(tmp_path, [[1, 2, 3, 40]], 50)
    model = tiny_model(vocab=17, layers=1)
    with pytest.raises(ValueError, match="datastore: .* built for another tokenizer"):
        generate(model, [[1, 2, 3]], drafter=RetrievalDrafter(store), max_new_tokens=3)
    with pytest.raises(ValueError, match="outside \\[0, 50\\)"):
        build_datastore([[1, 60]], tmp_path / "x", fingerprint={"vocab_size": 50})


def test_datastore_for_another_tokenizer_hash_is_refused(tmp_path):
    class Tok:
        name_or_path = "mine"

        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

        def __len__(self):
            return len(self.vocab)

    from specdec_kernels.retrieval import tokenizer_fingerprint

    build_datastore([[0, 1]], tmp_path / "s",
                    fingerprint=tokenizer_fingerprint(Tok({"a": 0, "b": 1})))
    store = Datastore(tmp_path / "s")
    store.check_tokenizer(Tok({"b": 1, "a": 0}))
    with pytest.raises(ValueError, match="built for tokenizer 'mine'"):
        store.check_tokenizer(Tok({"a": 1, "b": 0}))


def test_empty_drafter_list_and_bad_prophets_are_refused():
    with pytest.raises(ValueError, match="drafters: give at least one"):
        MultiDrafter([])
    with pytest.raises(ValueError, match="prophets: give at least one"):
        make_drafter("multi", prophets="")
    with pytest.raises(ValueError, match="prophets: cannot merge"):
        make_drafter("multi", prophets=["multi"])
    with pytest.raises(FileNotFoundError, match="no datastore"):
        RetrievalDrafter("/nonexistent/store").bind(None, None)


# ---------------------------------------------------------------------------- budget


def ancestor_closed_subsets(parents):
    nodes = range(1, len(parents))
    for r in range(len(parents)):
        for subset in itertools.combinations(nodes, r):
            chosen = set(subset) | {0}
            if all(parents[j] in chosen for j in subset):
                yield subset


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch", [1, 3])
def test_budget_matches_exhaustive_search(seed, batch):
    rng = random.Random(seed)
    curve = {1: 1.0, 2: 1.05, 3: 1.3, 5: 1.5, 7: 2.6, 9: 2.8, 13: 5.0, 40: 9.0}
    budget = TreeBudget(curve, max_nodes=6)
    trees = []
    for _ in range(batch):
        size = rng.randint(1, 7)
        parents = [-1] + [rng.randrange(j) for j in range(1, size)]
        cond = [1.0] + [rng.choice([0.0, rng.random(), 1.0]) for _ in range(1, size)]
        trees.append((parents, path_probabilities(parents, cond)))
    kept, expected, cost = budget.choose(trees)
    for (parents, _), nodes in zip(trees, kept):
        assert nodes[0] == 0 and all(parents[j] in nodes for j in nodes[1:])
    # Exhaustive: every combination of ancestor-closed subsets of one common size n.
    best = 0.0
    per_tree = [list(ancestor_closed_subsets(p)) for p, _ in trees]
    for combo in itertools.product(*per_tree):
        n = max(len(s) for s in combo)
        if n > 6:
            continue
        value = sum(1 + sum(probs[j] for j in s) for s, (_, probs) in zip(combo, trees))
        best = max(best, value / budget.cost(n + 1, batch))
    assert expected / cost == pytest.approx(best, rel=1e-12)


def test_acceptance_stats_learn_and_combine():
    stats = AcceptanceStats(prior_weight=2.0, priors={"a": 0.5})
    assert stats.rate("a", 1, 0) == pytest.approx(0.5)
    for _ in range(98):
        stats.record("a", 1, 0, True)
    assert stats.rate("a", 1, 0) == pytest.approx(99 / 100)
    assert stats.combined({"a": 0, "b": 0}, 1) == pytest.approx(1 - (1 / 100) * 0.7)
    assert stats.table()["a"]["1,0"] == [98, 98]


def test_candidate_tree_deduplicates_and_remembers_prophets():
    tree = CandidateTree(7)
    a = tree.add_tree([7, 1, 2, 3], [-1, 0, 1, 2], "chain", max_depth=8)
    b = tree.add_tree([7, 1, 4, 2, 0], [-1, 0, 0, 1, -2], "tree", max_depth=2)
    assert a == [0, 1, 2, 3] and b == [0, 1, 4, 2, -1]
    assert tree.sources[1] == {"chain": 0, "tree": 0} and tree.sources[4] == {"tree": 1}
    assert tree.sources[2] == {"chain": 0, "tree": 0} and len(tree) == 5


# ---------------------------------------------------------------------------- tiny models

TINY_VOCAB = 13


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama", vocab=TINY_VOCAB, layers=2, seed=5)


@pytest.fixture(scope="module")
def tiny_store(tiny, tmp_path_factory):
    """A datastore of the tiny target's own greedy continuations (so drafts are accepted)."""
    rng = random.Random(1)
    docs = []
    for _ in range(12):
        prompt = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(2, 6))]
        docs.append(prompt + hf_greedy(tiny, prompt, 20))
    path = tmp_path_factory.mktemp("store") / "tiny"
    build_datastore(docs, path, fingerprint={"vocab_size": TINY_VOCAB})
    return Datastore(path)


def tiny_drafter(name, store, heads=None):
    if name == "retrieval":
        return RetrievalDrafter(store, max_depth=5, max_nodes=7)
    if name == "quantized-self":
        return QuantizedSelfDrafter(num_draft=3)
    if name == "multi-lookup-retrieval":
        return MultiDrafter([PromptLookupDrafter(max_ngram=3, max_depth=4),
                             RetrievalDrafter(store, budget=False, max_nodes=9)], max_nodes=11)
    if name == "multi-all":
        return MultiDrafter(
            [PromptLookupDrafter(max_ngram=3, max_depth=4),
             RetrievalDrafter(store, budget=False, max_nodes=9),
             MedusaDrafter(heads, tree=[(0,), (1,), (0, 0)]),
             QuantizedSelfDrafter(num_draft=2)],
            max_nodes=13, cost_curve={1: 1.0, 16: 1.0, 64: 4.0},
        )
    raise ValueError(name)


TINY_PROMPTS = [[1, 2, 3, 1, 2], [4], [5, 6, 7, 8, 9, 10, 11], [3, 3, 3, 3, 3, 3, 3, 3, 3], [2, 9]]
TINY_DRAFTERS = ["retrieval", "quantized-self", "multi-lookup-retrieval", "multi-all"]


@pytest.mark.parametrize("cpu_kernels", [False, True])
@pytest.mark.parametrize("name", TINY_DRAFTERS)
def test_tiny_greedy_matches_hf_generate_batch_1_and_4(tiny, tiny_store, name, cpu_kernels):
    heads = random_heads(32, TINY_VOCAB, 2, 1, seed=3)
    want = [hf_greedy(tiny, p, 19) for p in TINY_PROMPTS]
    if cpu_kernels:  # the package's kernels: its own autoregressive output is the reference
        want = [generate(tiny, [p], max_new_tokens=19, eos_token_id=[]).tokens[0]
                for p in TINY_PROMPTS]
    forwards = emitted = 0
    for p, w in zip(TINY_PROMPTS, want):
        out = generate(tiny, [p], drafter=tiny_drafter(name, tiny_store, heads),
                       max_new_tokens=19, eos_token_id=[], cpu_kernels=cpu_kernels)
        assert out.tokens[0] == w, (name, p)
        forwards += out.stats.target_forwards
        emitted += out.stats.new_tokens
    assert emitted / forwards > 1.1, (name, emitted / forwards)  # drafts were accepted
    out = generate(tiny, TINY_PROMPTS[:4], drafter=tiny_drafter(name, tiny_store, heads),
                   max_new_tokens=[19, 7, 19, 13], eos_token_id=[], cpu_kernels=cpu_kernels)
    assert out.tokens == [w[:n] for w, n in zip(want[:4], [19, 7, 19, 13])], name
    if name.startswith("multi"):
        prophets = out.stats.drafter_report["prophets"]
        assert sum(p["drafts_accepted"] for p in prophets.values()) > 0
        assert all(0 <= p["share_of_emitted_tokens"] <= 1 for p in prophets.values())


@pytest.fixture(scope="module")
def sampling_target():
    return tiny_model("llama", vocab=VOCAB, layers=3, seed=11)


def test_merged_tree_sampling_follows_the_target_distribution(sampling_target, tmp_path):
    target = sampling_target
    exact = [exact_distribution(target, c) for c in CONFIGS]
    # A store of sampled-looking sequences over the tiny vocabulary (drafts sometimes right).
    rng = random.Random(4)
    store = store_of(tmp_path, [[rng.randrange(VOCAB) for _ in range(40)] for _ in range(6)]
                     + [PROMPT + [0, 4, 3, 1, 2]], VOCAB)
    heads = random_heads(32, VOCAB, 2, 1, std=0.2, own_projection=True)
    with torch.no_grad():
        for p in heads.projections:
            p.weight.copy_(target.lm_head.weight + 0.3 * torch.randn_like(p.weight))
    drafter = MultiDrafter(
        [PromptLookupDrafter(max_ngram=2, max_depth=3, max_branches=3),
         RetrievalDrafter(store, budget=False, max_depth=3, max_nodes=6, min_suffix=1),
         MedusaDrafter(heads, tree=[(0,), (1,), (0, 0), (0, 1)])],
        max_nodes=9, cost_curve={1: 1.0, 16: 1.0, 64: 4.0},
    )
    out = run_batch(target, drafter)
    assert_follows_target(out, exact)
    assert out.stats.tau > 1.05


def test_quantized_copy_leaves_the_target_alone(tiny):
    from specdec_kernels.decoding.quantized import quantized_copy
    from specdec_kernels.models.quantized_weight import QuantizedWeight

    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    q = quantized_copy(tiny, bits=4, group=32)
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())
    assert any(isinstance(b, QuantizedWeight) for b in q.buffers())
    assert not any(isinstance(b, QuantizedWeight) for b in tiny.buffers())
    with pytest.raises(ValueError, match="model: quantized-self needs a float32 or bfloat16"):
        quantized_copy(tiny_model(vocab=5, layers=1, dtype=torch.float16))
    with pytest.raises(ValueError, match="bits"):
        QuantizedSelfDrafter(bits=3)
    with pytest.raises(ValueError, match="group"):
        QuantizedSelfDrafter(bits=4, group=16)
    with pytest.raises(ValueError, match="head_bits must be 4 or 8, got 6"):
        QuantizedSelfDrafter(head_bits=6)
    for bad in (-1, 65, 2.0, True):
        with pytest.raises(ValueError, match="rerank must be an integer in"):
            QuantizedSelfDrafter(rerank=bad)


def test_quantized_self_on_a_quantized_target_says_why_it_rarely_drafts(tiny, capsys):
    """A target whose linears are quantized already (a GGUF model at its file's precision): the
    copy keeps them, which looks like plain decoding, so the drafter says so on stderr, once
    per target; a float32 target gets no such note."""
    from specdec_kernels.decoding import ModelRunner
    from specdec_kernels.decoding.quantized import quantized_copy

    QuantizedSelfDrafter(num_draft=2).bind(ModelRunner(tiny), None)
    assert "precision already" not in capsys.readouterr().err
    quantized = quantized_copy(tiny, bits=4, group=32)  # stands for a file-precision target
    QuantizedSelfDrafter(num_draft=2).bind(ModelRunner(quantized), None)
    err = capsys.readouterr().err
    assert "at its file's precision already" in err and "--weights float32" in err
    QuantizedSelfDrafter(num_draft=2).bind(ModelRunner(quantized), None)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("head_bits", [4, 8])
def test_quantized_copy_holds_its_lm_head_at_head_bits(tiny, head_bits):
    """The layers at 4 bits, the LM head at ``head_bits``; a tied embedding stays the
    target's own float table; the int8 head is the closer to the float one."""
    from specdec_kernels.decoding.quantized import quantized_copy
    from specdec_kernels.models.quantized_weight import QuantizedWeight

    q = quantized_copy(tiny, bits=4, group=32, head_bits=head_bits)
    head = q.get_output_embeddings().weight
    assert isinstance(head, QuantizedWeight) and head.kind == f"int{head_bits}/g32"
    layers = [m.weight for m in q.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and all(w.kind == "int4/g32" for w in layers)
    embedding = q.get_input_embeddings().weight
    assert not isinstance(embedding, QuantizedWeight)
    assert embedding.data_ptr() == tiny.get_input_embeddings().weight.data_ptr()
    dense = tiny.get_output_embeddings().weight.detach()
    error = (head.dequantize().float() - dense).norm()
    other = quantized_copy(tiny, bits=4, group=32, head_bits=12 - head_bits)
    other_error = (other.get_output_embeddings().weight.dequantize().float() - dense).norm()
    assert (error < other_error) == (head_bits == 8)
    # An int8 copy's groups of 16 are too small for an int4 head: it takes groups of 32.
    mixed = quantized_copy(tiny, bits=8, group=16, head_bits=4).get_output_embeddings().weight
    assert mixed.kind == "int4/g32"


@pytest.mark.parametrize("shape, k", [((1, 49152), 4), ((3, 2, 1536), 3), ((2, 640), 5), ((4, 1000), 2)])
def test_top_columns_are_the_largest_values(shape, k):
    """Block maxima first, then within the best blocks: the same columns as ``topk`` (random
    values do not tie), including a row whose best values share one block; shapes the blocks
    do not fit take ``topk`` itself."""
    from specdec_kernels.models.quantized_weight import top_columns

    gen = torch.Generator().manual_seed(shape[-1] + k)
    logits = torch.randn(*shape, generator=gen)
    logits[..., 5:5 + k] += 100  # one block holds all k
    got = top_columns(logits, k)
    want = logits.topk(k, dim=-1).indices
    assert got.shape == want.shape
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)
    spread = torch.randn(*shape, generator=gen)
    assert torch.equal(top_columns(spread, k).sort(-1).values,
                       spread.topk(k, dim=-1).indices.sort(-1).values)


@pytest.mark.parametrize("rows, candidates", [(64, 1), (64, 4), (67, 5), (2048, 4)])  # panels; rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reranked_head_rescores_its_best_columns_with_the_exact_rows(rows, candidates, dtype):
    """Each row's ``candidates`` best coarse logits become the exact rows' (bias included), the
    others stay the coarse head's; a row's logits are the same bits alone or in a batch."""
    from specdec_kernels.models.quantized_weight import (
        QuantizedWeight,
        RerankedWeight,
        pack_panels,
        quantize_weight,
        top_columns,
    )

    gen = torch.Generator().manual_seed(rows + candidates)
    exact = torch.randn(rows, 64, generator=gen).to(dtype)
    coarse = pack_panels(quantize_weight(exact, 4, 32))
    head = RerankedWeight(coarse, exact, candidates)
    x = torch.randn(2, 5, 64, generator=gen).to(dtype)
    bias = torch.randn(rows, generator=gen).to(dtype)
    out = torch.nn.functional.linear(x, head, bias)
    rough = coarse.linear(x, bias)
    top = top_columns(rough, candidates)
    # The largest coarse values (topk's, up to which of tied values: bfloat16 ties often).
    assert torch.equal(rough.gather(-1, top).sort(-1).values,
                       rough.topk(candidates, -1).values.sort(-1).values)
    want = rough.scatter(-1, top, ((exact[top] * x.unsqueeze(-2)).sum(-1) + bias[top]).to(dtype))
    assert torch.equal(out, want)
    dense = torch.nn.functional.linear(x.float(), exact.float(), bias.float())
    torch.testing.assert_close(out.gather(-1, top).float(), dense.gather(-1, top),
                               rtol=2e-2, atol=2e-2)
    alone = torch.cat([torch.nn.functional.linear(x[i : i + 1, j : j + 1], head, bias)
                       for i in range(2) for j in range(5)]).view_as(out)
    assert torch.equal(out, alone)
    assert isinstance(head.to(dtype), RerankedWeight)
    # A draft vocabulary's rows of it stay re-scored: its logits at those columns.
    from specdec_kernels.models.quantized_weight import weight_rows

    ids = torch.tensor([0, 3, 17, 40, rows - 1])
    part = weight_rows(head, ids)
    assert isinstance(part, RerankedWeight) and part.candidates == min(candidates, 5)
    part_out = torch.nn.functional.linear(x, part)
    assert torch.equal(part.dequantize(), coarse.dequantize()[ids])
    want_part = QuantizedWeight.linear(part, x)  # its coarse logits (the row layout's rounding)
    top = top_columns(want_part, part.candidates)
    rows_exact = exact[ids]
    want_part = want_part.scatter(
        -1, top, (rows_exact[top] * x.unsqueeze(-2)).sum(-1).to(dtype))
    assert torch.equal(part_out, want_part)
    with pytest.raises(ValueError, match="candidates must be in"):
        RerankedWeight(coarse, exact, 0)
    with pytest.raises(ValueError, match="exact rows must match the coarse head"):
        RerankedWeight(coarse, exact[:-1], 2)


def test_reranked_copy_agrees_with_the_target_where_the_int4_head_does_not(tiny):
    """quantized_copy(rerank=N) keeps the int4 head and re-scores its top N with the target's
    own (shared) rows: on a tiny model its argmax agrees with the dense head's at least as
    often as the bare int4 head's, and the greedy output of the drafter stays the target's."""
    from specdec_kernels.decoding.quantized import quantized_copy
    from specdec_kernels.models.quantized_weight import RerankedWeight

    q = quantized_copy(tiny, bits=4, group=32, head_bits=4, rerank=3)
    head = q.get_output_embeddings().weight
    dense = tiny.get_output_embeddings().weight
    assert isinstance(head, RerankedWeight) and head.exact.data_ptr() == dense.data_ptr()
    bare = quantized_copy(tiny, bits=4, group=32, head_bits=4).get_output_embeddings().weight
    assert not isinstance(bare, RerankedWeight)
    x = torch.randn(400, dense.shape[1], generator=torch.Generator().manual_seed(0))
    want = (x @ dense.detach().T).argmax(-1)
    agree = (torch.nn.functional.linear(x, head).argmax(-1) == want).float().mean()
    agree_bare = (torch.nn.functional.linear(x, bare).argmax(-1) == want).float().mean()
    assert agree >= agree_bare and agree > 0.95
    prompts = [PROMPT, [5, 2, 9]]
    drafter = QuantizedSelfDrafter(head_bits=4, rerank=3, num_draft=3,
                                   cost_curve={1: 1.0, 64: 1.0})
    out = generate(tiny, prompts, drafter=drafter, max_new_tokens=10, eos_token_id=[])
    assert out.tokens == generate(tiny, prompts, max_new_tokens=10, eos_token_id=[]).tokens
    assert "top 3 re-scored" in out.stats.drafter["model"]


# ---------------------------------------------------------------------------- default model

NEW_TOKENS = 24
NUM_PROMPTS = 8


@pytest.fixture(scope="module")
def prompts(loaded):
    from specdec_kernels.models import encode_prompts

    return encode_prompts(loaded.tokenizer, dev_prompts()[:NUM_PROMPTS])


@pytest.fixture(scope="module")
def expected(loaded, prompts):
    """The package's own greedy output (CPU kernels; equals HF's but for near ties, which
    test_decoding_greedy checks)."""
    return [generate(loaded, [p], max_new_tokens=NEW_TOKENS).tokens[0] for p in prompts]


@pytest.mark.default_model
@pytest.mark.parametrize("name", ["retrieval", "quantized-self", "multi"])
def test_default_model_greedy_identity_batch_1_and_4(loaded, prompts, expected, name):
    forwards = emitted = 0
    for p, want in zip(prompts[:4], expected):
        out = generate(loaded, [p], drafter=name, max_new_tokens=NEW_TOKENS)
        assert out.tokens[0] == want, name
        forwards += out.stats.target_forwards
        emitted += out.stats.new_tokens
    assert emitted / forwards > 1.0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))[:: 2]
    out = generate(loaded, [prompts[i] for i in order], drafter=name,
                   max_new_tokens=NEW_TOKENS)
    assert out.tokens == [expected[i] for i in order], name


@pytest.mark.default_model
def test_shipped_datastore_is_for_the_default_model(loaded):
    from specdec_kernels.decoding.retrieval import default_datastore_path

    store = Datastore(default_datastore_path())
    store.check_tokenizer(loaded.tokenizer)
    assert store.meta["num_tokens"] > 5000 and "command" in store.meta


# ---------------------------------------------------------------------------- command line


@pytest.mark.default_model
@pytest.mark.parametrize("drafter, extra", [
    ("retrieval", ["--max-suffix", "12"]),
    ("quantized-self", ["--num-draft", "2"]),
    ("multi", ["--prophets", "prompt-lookup,retrieval"]),
])
def test_cli_generate_runs_the_new_drafters(capsys, loaded, drafter, extra):
    from specdec_kernels import cli

    assert cli.main(["generate", "--drafter", drafter, *extra, "--max-new-tokens", "6",
                     "--json", "Count: one two three, one two three,"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["method"] == drafter and len(out["tokens"][0]) == 6


@pytest.mark.default_model
def test_cli_datastore_build_and_bad_corpus(tmp_path, capsys, loaded):
    from specdec_kernels import cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "The quick brown fox jumps over the lazy dog."}) + "\n"
                      + json.dumps({"text": "Speculative decoding verifies drafts."}) + "\n")
    (tmp_path / "notes.txt").write_text("First paragraph.\n\nSecond paragraph.\n")
    assert cli.main(["datastore", "build", str(corpus), str(tmp_path / "notes.txt"),
                     "--out", str(tmp_path / "store")]) == 0
    store = Datastore(tmp_path / "store")
    assert store.meta["num_documents"] == 4 and "datastore build" in store.meta["command"]
    store.check_tokenizer(loaded.tokenizer)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["datastore", "build", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert "specdec: error: corpus:" in capsys.readouterr().err


# ---------------------------------------------------------------------------- pausing prophets


def test_a_prophet_that_does_not_pay_sits_out_longer_each_time():
    from specdec_kernels.decoding.multi import MAX_PAUSE_STEPS, PAUSE_STEPS, PROBE_STEPS, ProphetPause

    pause = ProphetPause()

    def probe(worth, cost):
        """Propose and record until the prophet is paused (or PROBE_STEPS * 4 steps)."""
        for _ in range(PROBE_STEPS * 4):
            assert pause.proposes()
            pause.record(worth, cost)
            if pause._left:
                return True
        return False

    def paused_for():
        steps = 0
        while not pause.proposes():
            steps += 1
        return steps

    assert not probe(worth=2e-3, cost=1e-3)  # it pays: never paused
    lengths = []
    for _ in range(6):
        assert probe(worth=0.0, cost=1e-3)
        lengths.append(paused_for())
        pause.record(0.0, 1e-3)  # the step after the pause, proposed
    assert lengths == [min(PAUSE_STEPS * 2 ** i, MAX_PAUSE_STEPS) for i in range(6)]
    assert not probe(worth=5e-3, cost=1e-3)  # paying again
    assert probe(worth=0.0, cost=1e-3) and paused_for() == PAUSE_STEPS  # the length reset
    assert pause.steps_paused == sum(lengths) + PAUSE_STEPS


class _Guesser(PromptLookupDrafter):
    """One guessed token a step (rarely the target's), slow to propose."""

    name = "guesser"

    def __init__(self, *, pausable=True, seconds=2e-3):
        super().__init__(max_ngram=2, max_depth=1)
        self.pausable, self.seconds, self.proposals = pausable, seconds, 0

    def propose(self, state):
        import time

        from specdec_kernels.decoding.drafter import ChainProposal

        self.proposals += 1
        time.sleep(self.seconds)
        guess = (state.pending * 7 + 3) % TINY_VOCAB
        return ChainProposal(guess[:, None], torch.ones_like(guess), [1] * state.batch)


@pytest.mark.parametrize("pausable", [True, False])
def test_multi_pauses_a_pausable_prophet_that_does_not_pay(tiny, pausable):
    from specdec_kernels.decoding.multi import PAUSE_STEPS

    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    want = generate(tiny, [prompt], max_new_tokens=80, eos_token_id=[]).tokens
    guesser = _Guesser(pausable=pausable)
    drafter = MultiDrafter([PromptLookupDrafter(max_ngram=3, max_depth=4), guesser],
                           max_nodes=8, cost_curve={1: 5.0, 64: 5.0})
    out = generate(tiny, [prompt], drafter=drafter, max_new_tokens=80, eos_token_id=[])
    assert out.tokens == want
    report = out.stats.drafter_report["prophets"]
    steps = out.stats.target_forwards
    if pausable:
        assert report["guesser"]["steps_paused"] >= PAUSE_STEPS
        assert guesser.proposals + report["guesser"]["steps_paused"] == steps
    else:
        assert report["guesser"]["steps_paused"] == 0 and guesser.proposals == steps
    if pausable:  # the lookup's drafts pay for its time more often than the guesses
        assert report["prompt-lookup"]["steps_paused"] < report["guesser"]["steps_paused"]


@pytest.mark.parametrize("narrow_kv", [True, False])
def test_quantized_self_seeds_its_cache_from_the_target_prefill(tiny, monkeypatch, narrow_kv):
    """The copy does not prefill the prompt again: its cache starts as the target's rows
    (prefilling the copy through the integer kernel cost about what the target's prefill does),
    rounded to bfloat16 with ``narrow_kv`` (the default), and the output stays the plain
    loop's."""
    from specdec_kernels.decoding.quantized import _same_cache_layout
    from specdec_kernels.decoding.runner import ModelRunner

    prefills, seeded = [], []
    real_prefill = ModelRunner.prefill

    def counting_prefill(runner, cache, prompts, *args, **kwargs):
        prefills.append(runner.model)
        return real_prefill(runner, cache, prompts, *args, **kwargs)

    real_start = QuantizedSelfDrafter.start

    def checking_start(drafter, state):
        real_start(drafter, state)
        n = state.cache.host_lens
        assert drafter.cache.host_lens == n and torch.equal(drafter.cache.lens, state.cache.lens)
        assert drafter.cache.buffer.data_ptr() != state.cache.buffer.data_ptr()  # a copy
        kv_dtype = torch.bfloat16 if narrow_kv else torch.float32
        assert drafter.cache.buffer.dtype == kv_dtype
        assert torch.equal(drafter.cache.buffer[..., : min(n), :],
                           state.cache.buffer[..., : min(n), :].to(kv_dtype))
        seeded.append(True)

    monkeypatch.setattr(ModelRunner, "prefill", counting_prefill)
    monkeypatch.setattr(QuantizedSelfDrafter, "start", checking_start)
    prompts = TINY_PROMPTS[:3]
    want = generate(tiny, prompts, max_new_tokens=11, eos_token_id=[]).tokens
    prefills.clear()
    out = generate(tiny, prompts, drafter=QuantizedSelfDrafter(num_draft=3, narrow_kv=narrow_kv),
                   max_new_tokens=11, eos_token_id=[])
    assert out.tokens == want and seeded
    assert prefills == [tiny]  # the target's prefill only
    assert sum(sum(r.proposed_at) for r in out.stats.requests) > 0  # the copy drafted
    # A draft whose rows differ from the target's (here fewer layers) prefills itself.
    assert _same_cache_layout(tiny, tiny) and not _same_cache_layout(truncated_copy(tiny, 1), tiny)
