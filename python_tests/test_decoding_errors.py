"""Bad input gets a clear ValueError: mismatched tokenizers / vocabularies, empty prompts,
max_new_tokens < 1, prompts on several devices, bad sampling or drafter settings."""

import pytest
import torch

from python_tests.decoding_helpers import tiny_model
from specdec_kernels.decoding import (
    DraftModelDrafter,
    PromptLookupDrafter,
    SelfSpeculativeDrafter,
    generate,
    make_drafter,
)
from specdec_kernels.decoding.draft_model import check_same_vocabulary


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab=32)


class FakeTokenizer:
    def __init__(self, vocab):
        self._vocab = vocab
        self.eos_token_id = None

    def get_vocab(self):
        return dict(self._vocab)


def test_mismatched_tokenizers(model):
    target_tok = FakeTokenizer({f"t{i}": i for i in range(32)})
    draft_tok = FakeTokenizer({**{f"t{i}": i for i in range(32)}, "t3": 4, "t4": 3})
    with pytest.raises(ValueError, match="tokenizer does not match"):
        check_same_vocabulary(target_tok, draft_tok)
    drafter = DraftModelDrafter(tiny_model("llama", vocab=32, seed=1), tokenizer=draft_tok)
    with pytest.raises(ValueError, match="tokenizer does not match"):
        generate(model, [[1, 2]], drafter=drafter, tokenizer=target_tok, max_new_tokens=2)


def test_mismatched_vocabulary_without_tokenizers(model):
    drafter = DraftModelDrafter(tiny_model("llama", vocab=48, seed=1))
    with pytest.raises(ValueError, match=r"vocabulary \(48\) differs from the target's \(32\)"):
        generate(model, [[1, 2]], drafter=drafter, max_new_tokens=2)


def test_empty_prompt(model):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, [[1, 2], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="inputs is an empty list: give at least one prompt"):
        generate(model, [], max_new_tokens=2)
    with pytest.raises(ValueError, match="inputs is an empty tuple"):
        generate(model, (), max_new_tokens=2)
    with pytest.raises(ValueError, match="inputs must be a prompt, .* got int"):
        generate(model, 7, max_new_tokens=2)


@pytest.mark.parametrize("bad", [0, -3, [4, 0]])
def test_max_new_tokens_below_one(model, bad):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        generate(model, [[1, 2], [3]], max_new_tokens=bad)


def test_prompts_on_several_devices(model):
    prompts = [torch.tensor([1, 2]), torch.tensor([3, 4], device="meta")]
    with pytest.raises(ValueError, match=r"several devices \(cpu, meta\)"):
        generate(model, prompts, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompts are on meta but the model is on cpu"):
        generate(model, torch.ones(1, 3, dtype=torch.long, device="meta"), max_new_tokens=2)


def test_draft_model_on_another_device(model):
    draft = tiny_model("llama", vocab=32, seed=1).to("meta")
    with pytest.raises(ValueError, match="draft model is on meta, the target on cpu"):
        generate(model, [[1, 2]], drafter=DraftModelDrafter(draft), max_new_tokens=2)


def test_token_ids_outside_the_vocabulary(model):
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 32\)"):
        generate(model, [[1, 32]], max_new_tokens=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-2), "top_k must be >= 0"),
        (dict(min_p=1.0), r"min_p must be in \[0, 1\)"),
        (dict(seed=[1, 2, 3]), "seed has 3 entries for 2 requests"),
        (dict(stop_strings=["x"]), "stop_strings need a tokenizer"),
        (dict(drafter="hydra"), "unknown drafter 'hydra'"),
        (dict(drafter="eagle"), "EAGLE draft was trained for a target of hidden size 576"),
        (dict(drafter="draft-model"), "needs draft_model"),
        (dict(drafter=3), "drafter must be a Drafter or a drafter name, got int"),
        (dict(drafter="prompt-lookup", draft_model=torch.nn.Linear(1, 1)),
         "the prompt-lookup drafter drafts without one: pass drafter='draft-model'"),
        (dict(drafter=PromptLookupDrafter(), draft_model=torch.nn.Linear(1, 1)),
         "draft_model was given: pass drafter='draft-model'"),
        (dict(drafter="multi", draft_model=torch.nn.Linear(1, 1)),
         "no prophet drafts with it: add 'draft-model' to prophets"),
    ],
)
def test_bad_settings(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, [[1, 2], [3, 4]], max_new_tokens=2, **kwargs)


def test_text_prompts_need_a_tokenizer(model):
    with pytest.raises(ValueError, match="text prompts need a tokenizer"):
        generate(model, "hello", max_new_tokens=2)


@pytest.mark.parametrize("layers", [0, 3, 7])
def test_self_speculative_layer_count(model, layers):
    with pytest.raises(ValueError, match="num_layers must be"):
        generate(model, [[1, 2]], drafter=SelfSpeculativeDrafter(layers), max_new_tokens=2)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: PromptLookupDrafter(min_ngram=3, max_ngram=2), "min_ngram <= max_ngram"),
        (lambda: PromptLookupDrafter(max_nodes=0), "must be >= 1"),
        (lambda: SelfSpeculativeDrafter(2, num_draft=0), "num_draft must be >= 1"),
        (lambda: SelfSpeculativeDrafter(2, confidence_threshold=1.5), "confidence_threshold"),
        (lambda: SelfSpeculativeDrafter(2, min_draft=4, max_draft=2), "min_draft <= max_draft"),
    ],
)
def test_bad_drafter_settings(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_multi_hands_the_draft_model_to_its_draft_model_prophet_only(model):
    draft = tiny_model("llama", vocab=32, seed=1)
    out = generate(model, [[1, 2, 3]], drafter=make_drafter("multi", prophets="prompt-lookup,draft-model",
                                                             draft_model=draft), max_new_tokens=6)
    assert out.tokens == generate(model, [[1, 2, 3]], max_new_tokens=6).tokens
