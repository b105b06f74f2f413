"""Speculative decoding inside Hugging Face ``generate`` (:mod:`specdec_kernels.hf`): the
``custom_generate`` callable and the exported ``custom_generate/`` folder, on unmodified
models. For every drafter, greedy output equals plain ``model.generate`` at batch 1 and in a
left-padded batch of 4; streamers receive exactly the new tokens; generation-config settings
are honoured; unsupported combinations raise."""

import functools
import importlib.metadata
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    TextIteratorStreamer,
    TextStreamer,
)
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

import specdec_kernels
from python_tests.decoding_helpers import (
    default_model,
    random_eagle,
    random_heads,
    tiny_model,
    truncated_copy,
)
from specdec_kernels import cli
from specdec_kernels.decoding import DRAFTER_NAMES, Engine, StopCriteria, make_drafter
from specdec_kernels.sampling import SamplingParams

EOS, PAD = 5, 0
NEW = 14
# Ragged prompts (repetitive, so prompt lookup finds n-grams), left-padded as a tokenizer
# with padding_side="left" does.
PROMPTS = [[3, 4, 7, 9, 3, 4, 7], [1, 2, 3, 4, 5, 6, 1, 2, 3], [8, 9], [11, 12, 13, 12, 13, 11, 12]]


def left_pad(prompts, pad=PAD):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def model():
    m = tiny_model("llama", vocab=64, layers=3)
    m.generation_config.eos_token_id = EOS
    m.generation_config.pad_token_id = PAD
    return m


@pytest.fixture(scope="module")
def draft(model):
    return truncated_copy(model, 2)


@functools.lru_cache(maxsize=None)
def tiny_datastore():
    """A datastore over the tiny model's vocabulary (the shipped one is the default model's)."""
    from specdec_kernels.retrieval import build_datastore

    path = Path(tempfile.mkdtemp(prefix="specdec-store-")) / "tiny"
    build_datastore(PROMPTS + [p + p for p in PROMPTS], path, fingerprint={"vocab_size": 64})
    return str(path)


def drafter_options(name, draft):
    """What each drafter needs beyond its name to run on the tiny model: the shipped Medusa
    heads and datastore fit the default model, so the tiny one gets random heads of its size
    and a datastore of its vocabulary."""
    if name == "draft-model":
        return {"draft_model": draft}
    if name in ("medusa", "blockwise"):
        return {"heads": random_heads(32, 64)}
    if name == "retrieval":
        return {"datastore": tiny_datastore()}
    if name == "multi":
        return {"heads": random_heads(32, 64), "datastore": tiny_datastore()}
    if name == "eagle":  # reads layers 0..2 of the 3-layer target (the draft model's config)
        return {"eagle_draft": random_eagle(draft)}
    return {}


def drafter_kwargs(name, draft):
    """``generate`` keywords naming the drafter; head and retrieval drafters go as objects
    (``generate`` builds named ones with the shipped heads and datastore)."""
    if name in ("medusa", "blockwise", "retrieval", "multi", "eagle"):
        return {"drafter": make_drafter(name, **drafter_options(name, draft))}
    return {"drafter": name, **drafter_options(name, draft)}


CUSTOM = {"custom_generate": specdec_kernels.hf.generate}


@pytest.fixture(scope="module")
def plain(model):
    """Plain ``model.generate`` greedy, at batch 1 per prompt and as one padded batch."""
    single = [model.generate(**left_pad([p]), max_new_tokens=NEW, do_sample=False) for p in PROMPTS]
    batch = model.generate(**left_pad(PROMPTS), max_new_tokens=NEW, do_sample=False)
    return single, batch


def test_the_batch_exercises_eos_and_padding(model, plain):
    _, batch = plain
    new = batch[:, batch.shape[1] - NEW :]
    assert (new == EOS).any(), "no request stops at EOS: the test would not cover padding"


@pytest.mark.parametrize("name", DRAFTER_NAMES)
def test_greedy_equals_generate_batch_1(model, draft, plain, name):
    for prompt, expected in zip(PROMPTS, plain[0]):
        out = model.generate(
            **left_pad([prompt]),
            max_new_tokens=NEW,
            do_sample=False,
            **CUSTOM,
            **drafter_kwargs(name, draft),
        )
        assert torch.equal(out, expected), (name, prompt)


@pytest.mark.parametrize("name", DRAFTER_NAMES)
def test_greedy_equals_generate_batch_4_left_padded(model, draft, plain, name):
    drafter = make_drafter(name, **drafter_options(name, draft))
    out = model.generate(**left_pad(PROMPTS), max_new_tokens=NEW, **CUSTOM, drafter=drafter)
    assert torch.equal(out, plain[1]), name


CHATS = ["Name three colours.", "Repeat after me: one two three, one two three.", "Hi!"]


def test_default_model_with_its_tokenizer():
    """The bundled model, prompts through its chat template and a left-padding tokenizer."""
    loaded = default_model()
    tok = loaded.tokenizer
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in CHATS
    ]
    inputs = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (inputs["attention_mask"] == 0).any()
    expected = loaded.model.generate(**inputs, max_new_tokens=12, do_sample=False)
    out = loaded.model.generate(
        **inputs, max_new_tokens=12, do_sample=False, **CUSTOM, drafter="prompt-lookup"
    )
    assert torch.equal(out, expected)

    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    one = tok([texts[0]], return_tensors="pt", add_special_tokens=False)
    expected = loaded.model.generate(**one, max_new_tokens=12, do_sample=False)
    out = loaded.model.generate(
        **one, max_new_tokens=12, streamer=streamer, **CUSTOM, drafter="prompt-lookup"
    )
    assert torch.equal(out, expected)
    streamed = "".join(streamer)
    assert streamed == tok.decode(out[0, one["input_ids"].shape[1] :])


class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("name", ["prompt-lookup", "draft-model"])
def test_streamer_receives_exactly_the_final_tokens(model, draft, name):
    inputs = left_pad([PROMPTS[1]])
    streamer = Recorder()
    out = model.generate(
        **inputs, max_new_tokens=NEW, streamer=streamer, **CUSTOM, **drafter_kwargs(name, draft)
    )
    width = inputs["input_ids"].shape[1]
    assert streamer.puts[0] == inputs["input_ids"].tolist()  # the prompt, put by transformers
    streamed = [t for chunk in streamer.puts[1:] for t in chunk]
    assert streamed == out[0, width:].tolist() and streamer.ended == 1
    assert all(chunk for chunk in streamer.puts[1:])


def test_text_streamer(model, capsys):
    class Tok:  # the decode TextStreamer needs
        def decode(self, ids, **kwargs):
            return "".join(f"<{i}>" for i in ids)

    out = model.generate(
        **left_pad([PROMPTS[0]]),
        max_new_tokens=6,
        streamer=TextStreamer(Tok(), skip_prompt=True),
        **CUSTOM,
        drafter="prompt-lookup",
    )
    printed = capsys.readouterr().out.strip()
    assert printed == "".join(f"<{i}>" for i in out[0, len(PROMPTS[0]) :].tolist())


def test_on_emit_concatenates_to_the_outputs(model):
    """The engine's streaming callback: per request, the chunks add up to the output."""
    seen = {i: [] for i in range(len(PROMPTS))}
    finished = []

    def on_emit(request, tokens, done):
        seen[request].extend(tokens)
        if done:
            finished.append(request)

    engine = Engine(model, make_drafter("prompt-lookup"))
    stop = StopCriteria([NEW, 3, NEW, 9], {EOS}, [[]] * 4, None)
    result = engine.run(PROMPTS, SamplingParams.create(4), stop, on_emit)
    assert [seen[i] for i in range(4)] == result.tokens
    assert sorted(finished) == [0, 1, 2, 3]


def test_return_dict_max_length_and_num_return_sequences(model, plain):
    out = model.generate(
        **left_pad(PROMPTS),
        max_length=9 + NEW,
        return_dict_in_generate=True,
        **CUSTOM,
        drafter="prompt-lookup",
    )
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, plain[1])
    torch.manual_seed(0)
    sampled = model.generate(
        **left_pad(PROMPTS[:2]),
        max_new_tokens=6,
        do_sample=True,
        num_return_sequences=3,
        **CUSTOM,
        drafter="prompt-lookup",
    )
    assert sampled.shape[0] == 6
    assert len({tuple(r) for r in sampled[:3].tolist()}) > 1  # independent streams per copy


def test_sampling_parameters_reach_the_kernels(model, plain):
    """A near-zero temperature or top_k=1 make sampling greedy; the same seed repeats."""
    for settings in (dict(temperature=1e-4), dict(top_k=1), dict(top_p=1e-6)):
        out = model.generate(
            **left_pad(PROMPTS),
            max_new_tokens=NEW,
            do_sample=True,
            **settings,
            **CUSTOM,
            drafter="prompt-lookup",
        )
        assert torch.equal(out, plain[1]), settings
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(
            model.generate(
                **left_pad(PROMPTS),
                max_new_tokens=NEW,
                do_sample=True,
                temperature=1.5,
                top_p=0.9,
                min_p=0.01,
                **CUSTOM,
                drafter="prompt-lookup",
            )
        )
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], plain[1])


def test_min_new_tokens_and_min_length(model, plain):
    width = max(len(p) for p in PROMPTS)
    row, first_eos = min(
        (int(pos), r) for r, pos in (plain[1][:, width:] == EOS).nonzero().tolist()
    )[::-1]
    minimum = min(first_eos + 3, NEW - 1)
    for settings in (dict(min_new_tokens=minimum), dict(min_length=width + minimum)):
        expected = model.generate(
            **left_pad(PROMPTS), max_new_tokens=NEW, do_sample=False, **settings
        )
        out = model.generate(
            **left_pad(PROMPTS),
            max_new_tokens=NEW,
            do_sample=False,
            **settings,
            **CUSTOM,
            drafter="prompt-lookup",
        )
        assert torch.equal(out, expected), settings
        assert (out[row, width : width + minimum] != EOS).all()


def test_stopping_criteria_are_applied_per_token(model, plain):
    class StopAfter(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    token = int(plain[1][0, -NEW + 4])
    criteria = StoppingCriteriaList([StopAfter(token)])
    expected = model.generate(**left_pad(PROMPTS), max_new_tokens=NEW, stopping_criteria=criteria)
    out = model.generate(
        **left_pad(PROMPTS),
        max_new_tokens=NEW,
        stopping_criteria=criteria,
        **CUSTOM,
        drafter="prompt-lookup",
    )
    assert torch.equal(out, expected)


def test_stop_strings():
    """Folder route: stop_strings with the tokenizer; callable route: StopStringCriteria."""
    loaded = default_model()
    tok = loaded.tokenizer
    one = tok(["The capital of France is"], return_tensors="pt")
    full = loaded.model.generate(**one, max_new_tokens=16, do_sample=False)
    text = tok.decode(full[0, one["input_ids"].shape[1] :])
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    expected = loaded.model.generate(**one, max_new_tokens=16, stop_strings=[stop], tokenizer=tok)
    assert expected.shape[1] < full.shape[1]
    via_hub = specdec_kernels.hf.generate_from_hub(
        loaded.model,
        **one,
        max_new_tokens=16,
        stop_strings=[stop],
        tokenizer=tok,
        drafter="prompt-lookup",
    )
    assert torch.equal(via_hub, expected)
    loaded.model.generation_config.stop_strings = [stop]  # saved in the model's config
    try:
        saved = specdec_kernels.hf.generate_from_hub(
            loaded.model, **one, max_new_tokens=16, tokenizer=tok, drafter="prompt-lookup"
        )
        assert loaded.model.generation_config.stop_strings == [stop]  # restored
    finally:
        loaded.model.generation_config.stop_strings = None
    assert torch.equal(saved, expected)
    criteria = StoppingCriteriaList([StopStringCriteria(tok, [stop])])
    via_callable = loaded.model.generate(
        **one, max_new_tokens=16, stopping_criteria=criteria, **CUSTOM, drafter="prompt-lookup"
    )
    assert torch.equal(via_callable, expected)


def test_direct_call(model, plain):
    out = specdec_kernels.hf.generate(
        model, **left_pad(PROMPTS), max_new_tokens=NEW, drafter="prompt-lookup"
    )
    assert torch.equal(out, plain[1])


def test_exported_folder_route(model, plain, tmp_path, monkeypatch, capsys):
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    repo = tmp_path / "specdec-generate"
    assert cli.main(["export-custom-generate", str(repo)]) == 0
    assert "generate.py" in capsys.readouterr().out
    assert (repo / "custom_generate" / "generate.py").exists()
    assert "custom_generate" in (repo / "README.md").read_text()
    with pytest.raises(FileExistsError):
        cli.main(["export-custom-generate", str(repo)])
    assert cli.main(["export-custom-generate", str(repo), "--force"]) == 0
    try:  # transformers checks the folder's requirements.txt against installed distributions
        importlib.metadata.version("specdec_kernels")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("specdec_kernels is used in place, not pip-installed (the GPU machine's build)")

    streamer = Recorder()
    out = model.generate(
        **left_pad(PROMPTS),
        max_new_tokens=NEW,
        custom_generate=str(repo),
        trust_remote_code=True,
        drafter="prompt-lookup",
    )
    assert torch.equal(out, plain[1])
    out = model.generate(
        **left_pad([PROMPTS[2]]),
        max_new_tokens=NEW,
        custom_generate=str(repo),
        trust_remote_code=True,
        drafter="self-speculative",
        streamer=streamer,
    )
    assert torch.equal(out, plain[0][2])
    assert [t for c in streamer.puts[1:] for t in c] == out[0, len(PROMPTS[2]) :].tolist()


class Boost(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_beams=2), "not beam_search"),
        (dict(num_beams=2, do_sample=True), "not beam_sample"),
        (dict(prompt_lookup_num_tokens=3), "drafter='prompt-lookup'"),
        (dict(repetition_penalty=1.3), "RepetitionPenaltyLogitsProcessor is not supported"),
        (dict(logits_processor=LogitsProcessorList([Boost()])), "Boost is not supported"),
        (dict(no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor"),
        (
            dict(return_dict_in_generate=True, output_scores=True),
            "output_scores=True is not supported",
        ),
        (dict(return_dict_in_generate=True, output_logits=True), "output_logits=True"),
        (dict(drafter=3), "drafter must be a Drafter or a drafter name"),
        (dict(drafter="medusa-9000"), "unknown drafter"),
        (dict(draft_model=torch.nn.Linear(1, 1)), "pass drafter='draft-model'"),
    ],
)
def test_unsupported_combinations_raise(model, kwargs, message):
    kwargs.setdefault("drafter", "prompt-lookup")
    with pytest.raises(ValueError, match=message):
        model.generate(**left_pad(PROMPTS[:2]), max_new_tokens=4, **CUSTOM, **kwargs)


def test_prompt_ids_outside_the_vocabulary_raise(model):
    inputs = left_pad(PROMPTS[:2])
    inputs["input_ids"][1, -1] = model.config.vocab_size
    with pytest.raises(ValueError, match=r"prompt 1 has token ids outside the vocabulary"):
        model.generate(**inputs, max_new_tokens=4, **CUSTOM)


def test_more_refusals(model, draft):
    with pytest.raises(ValueError, match="assistant_model"):
        model.generate(**left_pad(PROMPTS[:1]), max_new_tokens=4, assistant_model=draft, **CUSTOM)
    right = left_pad(PROMPTS[:2])
    right["attention_mask"] = right["attention_mask"].flip(1)
    with pytest.raises(ValueError, match="not left-padded"):
        model.generate(**right, max_new_tokens=4, **CUSTOM)
    with pytest.raises(ValueError, match="a streamer takes one sequence"):
        model.generate(**left_pad(PROMPTS[:2]), max_new_tokens=4, streamer=Recorder(), **CUSTOM)
    with pytest.raises(ValueError, match=r"model inputs \['inputs_embeds'\]"):
        embeds = model.get_input_embeddings()(torch.tensor([PROMPTS[0]]))
        model.generate(inputs_embeds=embeds, max_new_tokens=4, **CUSTOM)
    with pytest.raises(ValueError, match="tokenizer"):
        specdec_kernels.hf.generate_from_hub(
            model, **left_pad(PROMPTS[:1]), max_new_tokens=4, stop_strings=["x"]
        )
