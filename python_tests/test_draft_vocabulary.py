"""A draft's LM head over its most frequent tokens (``draft_vocab``): the restricted copy's
logits are the draft model's at those ids, drafts never leave the set, greedy output is the
plain loop's at batch 1 and in ragged batches, rankings are counted, stored and checked
against their tokenizer, and bad options are refused by name."""

import json

import pytest
import torch

from python_tests.decoding_helpers import tiny_model, truncated_copy
from specdec_kernels.decoding import DraftModelDrafter, QuantizedSelfDrafter, generate
from specdec_kernels.decoding.calibration import step_cost_key
from specdec_kernels.decoding.draft_vocabulary import (
    count_ranking,
    draft_vocabulary,
    restricted_head_copy,
    token_ranking,
    vocabulary_fingerprint,
)
from specdec_kernels.decoding.quantized import quantized_copy
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.models.quantized_weight import QuantizedWeight

VOCAB = 67  # odd: the quantized head keeps the row layout; 64 below takes the panels


class FakeTokenizer:
    """Just a vocabulary (all the ranking needs)."""

    def __init__(self, size: int, salt: str = ""):
        self.vocab = {f"t{salt}{i}": i for i in range(size)}

    def get_vocab(self):
        return dict(self.vocab)


def logits_of(model, tokens, cpu_kernels):
    runner = ModelRunner(model, cpu_kernels=cpu_kernels)
    cache = runner.new_cache(len(tokens), 32)
    return runner.append(cache, tokens, want_logits=True)


def ids_of(vocab, size, seed):
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size].sort().values


@pytest.mark.parametrize("cpu_kernels", [False, True])
@pytest.mark.parametrize("head", ["float32", "bfloat16", "int4", "int8", "int8-panels"])
@pytest.mark.parametrize("size", [1, 13, 48])
def test_restricted_head_gives_the_models_logits_at_its_ids(head, size, cpu_kernels):
    vocab = 64 if head == "int8-panels" else VOCAB
    dtype = torch.bfloat16 if head == "bfloat16" else torch.float32
    model = tiny_model("llama", vocab=vocab, layers=2, seed=3, dtype=dtype)
    if head.startswith("int"):
        model = quantized_copy(model, bits=4, group=32, head_bits=8 if "8" in head else 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = ids_of(vocab, size, seed=size)
    restricted = restricted_head_copy(model, ids)
    tokens = [[1, 5, 9, 2], [7], [3, 3, 30]]
    full = logits_of(model, tokens, cpu_kernels)
    part = logits_of(restricted, tokens, cpu_kernels)
    assert part.shape == (3, size)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(part.float(), full[:, ids].float(), **tol)
    # The draft model is untouched, and the copy shares all but its head.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (restricted.get_input_embeddings().weight.data_ptr()
            == model.get_input_embeddings().weight.data_ptr())
    assert model.get_output_embeddings().weight.shape[0] == vocab
    new_head = restricted.get_output_embeddings().weight
    assert isinstance(new_head, QuantizedWeight) == head.startswith("int")


def test_restricted_head_refuses_ids_out_of_range():
    model = tiny_model("llama", vocab=VOCAB, layers=1)
    with pytest.raises(ValueError, match=r"draft_vocab: ids must lie in \[0, 67\)"):
        restricted_head_copy(model, torch.tensor([0, VOCAB]))
    with pytest.raises(ValueError, match="draft_vocab must be in"):
        draft_vocabulary(list(range(VOCAB)), VOCAB + 1)


def restricted_drafter(kind, model, size, **kwargs):
    if kind == "draft-model":
        return DraftModelDrafter(truncated_copy(model, 1), num_draft=3, draft_vocab=size, **kwargs)
    return QuantizedSelfDrafter(num_draft=3, draft_vocab=size, **kwargs)


PROMPTS = [[1, 2, 3, 1, 2], [4], [5, 6, 7, 8, 9, 10, 11], [3, 3, 3, 3, 3, 3, 3, 3, 3]]


@pytest.mark.parametrize("cpu_kernels", [False, True])
@pytest.mark.parametrize("kind", ["draft-model", "quantized-self"])
def test_greedy_output_is_the_plain_loops_and_drafts_stay_in_the_set(kind, cpu_kernels,
                                                                     monkeypatch):
    model = tiny_model("llama", vocab=VOCAB, layers=2, seed=5)
    plain = [generate(model, [p], max_new_tokens=17, eos_token_id=[],
                      cpu_kernels=cpu_kernels).tokens[0] for p in PROMPTS]
    size = 40
    allowed = set(range(size))  # no tokenizer: token ids in order
    drafted = []
    real_propose = DraftModelDrafter.propose

    def recording(self, state):
        proposal = real_propose(self, state)
        drafted.extend(proposal.tokens.flatten().tolist())
        return proposal

    monkeypatch.setattr(DraftModelDrafter, "propose", recording)
    for prompt, want in zip(PROMPTS, plain):
        out = generate(model, [prompt], drafter=restricted_drafter(kind, model, size),
                       max_new_tokens=17, eos_token_id=[], cpu_kernels=cpu_kernels)
        assert out.tokens[0] == want
    lengths = [17, 6, 17, 11]
    drafter = restricted_drafter(kind, model, size)
    out = generate(model, PROMPTS, drafter=drafter, max_new_tokens=lengths, eos_token_id=[],
                   cpu_kernels=cpu_kernels)
    assert out.tokens == [w[:n] for w, n in zip(plain, lengths)]
    assert drafted and set(drafted) <= allowed
    assert out.stats.tau > 1.0  # drafts were accepted
    described = drafter.describe()
    assert described["draft_vocab"] == size and described["token_ranking"] == "token ids in order"
    assert drafter.runner.vocab_size == size
    assert step_cost_key(drafter.runner)["head_rows"] == size


def test_widened_logits_put_every_other_token_out_of_reach():
    model = tiny_model("llama", vocab=VOCAB, layers=2, seed=5)
    drafter = DraftModelDrafter(truncated_copy(model, 1), draft_vocab=9)
    drafter.bind(ModelRunner(model), None)
    wide = drafter._target_vocab(torch.randn(2, 9))
    assert wide.shape == (2, VOCAB)
    assert torch.all(wide[:, 9:] == -1e30)
    assert torch.softmax(wide, -1)[:, 9:].sum() == 0


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "12"])
def test_bad_draft_vocab_is_refused_by_name(bad):
    model = tiny_model("llama", vocab=VOCAB, layers=1)
    with pytest.raises((ValueError, TypeError), match="draft_vocab"):
        DraftModelDrafter(model, draft_vocab=bad)
    with pytest.raises((ValueError, TypeError), match="draft_vocab"):
        QuantizedSelfDrafter(draft_vocab=bad)


def test_draft_vocab_larger_than_the_vocabulary_is_refused_at_bind():
    model = tiny_model("llama", vocab=VOCAB, layers=2)
    drafter = DraftModelDrafter(truncated_copy(model, 1), draft_vocab=VOCAB + 1)
    with pytest.raises(ValueError, match="draft_vocab: 68 exceeds the vocabulary of 67"):
        generate(model, [[1, 2]], drafter=drafter, max_new_tokens=3)


def test_count_ranking_orders_by_frequency_then_id():
    tok = FakeTokenizer(10)
    ranking = count_ranking([[3, 3, 7, 1], [7, 3, 9], [1]], tok, 10, {"command": "x"})
    assert ranking["ranked"] == [3, 1, 7, 9]
    assert ranking["tokens_counted"] == 8 and ranking["command"] == "x"
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 10\)"):
        count_ranking([[3, 10]], tok, 10)
    with pytest.raises(ValueError, match="no tokens"):
        count_ranking([[], []], tok, 10)


def test_ranking_file_round_trip_and_checks(tmp_path):
    tok = FakeTokenizer(10)
    path = tmp_path / "ranking.json"
    path.write_text(json.dumps(count_ranking([[4, 4, 2, 8, 4, 2]], tok, 10)))
    order, source = token_ranking(tok, 10, path)
    assert order == [4, 2, 8, 0, 1, 3, 5, 6, 7, 9]  # unseen tokens follow in id order
    assert "6 tokens counted" in source
    assert draft_vocabulary(order, 3).tolist() == [2, 4, 8]
    with pytest.raises(ValueError, match="counted with another tokenizer"):
        token_ranking(FakeTokenizer(10, salt="x"), 10, path)
    with pytest.raises(ValueError, match="ranks a vocabulary of 10 tokens, the model has 12"):
        token_ranking(FakeTokenizer(12), 12, path)
    bad = json.loads(path.read_text())
    bad["ranked"] = [4, 4]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="repeated or out-of-range"):
        token_ranking(tok, 10, path)
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="is not a specdec-token-ranking/1 file"):
        token_ranking(tok, 10, path)
    with pytest.raises(FileNotFoundError):
        token_ranking(tok, 10, tmp_path / "missing.json")
    # Without a ranking for the tokenizer: token ids in order.
    assert token_ranking(None, 10) == (list(range(10)), "token ids in order")
    assert token_ranking(FakeTokenizer(10), 10)[1] == "token ids in order"
    assert vocabulary_fingerprint(tok) != vocabulary_fingerprint(FakeTokenizer(10, salt="x"))


def test_drafter_reads_a_ranking_file(tmp_path):
    model = tiny_model("llama", vocab=VOCAB, layers=2, seed=5)
    tok = FakeTokenizer(VOCAB)
    path = tmp_path / "ranking.json"
    path.write_text(json.dumps(count_ranking([[60, 61, 62, 62, 5]], tok, VOCAB)))
    drafter = DraftModelDrafter(truncated_copy(model, 1), draft_vocab=4, token_ranking=str(path))
    drafter.bind(ModelRunner(model), tok)
    assert drafter._vocab_ids.tolist() == [5, 60, 61, 62]


@pytest.mark.default_model
def test_shipped_ranking_is_the_default_tokenizers_and_the_cli_counts_a_corpus(tmp_path, loaded):
    from specdec_kernels import cli

    vocab = ModelRunner(loaded.model).vocab_size
    order, source = token_ranking(loaded.tokenizer, vocab)
    assert source.startswith("smollm2-135m-instruct.json") and sorted(order) == list(range(vocab))
    # The most frequent tokens of an assistant's answers include the space-word " the".
    the = loaded.tokenizer(" the", add_special_tokens=False)["input_ids"]
    assert len(the) == 1 and the[0] in order[:32]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "the cat and the dog and the bird"}) + "\n")
    out = tmp_path / "ranking.json"
    assert cli.main(["draft-vocab", str(corpus), "--out", str(out)]) == 0
    ranked, source = token_ranking(loaded.tokenizer, vocab, out)
    assert ranked[0] == the[0] and "tokens counted" in source
    assert "specdec draft-vocab" in json.loads(out.read_text())["command"]


@pytest.mark.default_model
def test_default_model_quantized_self_with_a_draft_vocabulary_is_lossless(loaded):
    from specdec_kernels.models import encode_prompts

    prompts = encode_prompts(loaded.tokenizer, ["Name three colors.",
                                                "Explain what a volcano is in two sentences."])
    plain = generate(loaded, prompts, max_new_tokens=24)
    out = generate(loaded, prompts, drafter=QuantizedSelfDrafter(draft_vocab=4096),
                   max_new_tokens=24)
    assert out.tokens == plain.tokens


def test_a_head_without_a_weight_tensor_is_refused_by_name():
    model = tiny_model("llama", vocab=VOCAB, layers=1)

    class MethodWeight(torch.nn.Module):  # like torch.ao's dynamic quantized Linear
        def weight(self):
            return torch.zeros(VOCAB, 32)

    model.set_output_embeddings(MethodWeight())
    with pytest.raises(ValueError, match="draft_vocab: .* has no LM head weight to restrict"):
        restricted_head_copy(model, torch.tensor([0, 1]))
