"""The llama.cpp bench peer: a clear error without llama-cpp-python; with it (optional, built
from source), plain and prompt-lookup greedy runs on the default model's GGUF file."""

import importlib.util

import pytest

from python_tests.decoding_helpers import default_model_missing
from specdec_kernels.bench.methods import Sampling, build_methods


def test_missing_llama_cpp_is_a_clear_error(monkeypatch):
    import specdec_kernels.bench.llama_cpp as peer

    real = importlib.util.find_spec
    monkeypatch.setattr(peer.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(ValueError, match="llama-cpp-python is not installed.*GGML_NATIVE"):
        peer.LlamaCppMethod("llama-cpp", "x.gguf", set(), threads=1)


def test_llama_cpp_needs_a_gguf_file():
    from python_tests.decoding_helpers import tiny_model

    with pytest.raises(ValueError, match="runs a GGUF file"):
        build_methods(["llama-cpp"], tiny_model(), None)


@pytest.mark.default_model
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (optional)")
@pytest.mark.skipif(default_model_missing() is not None, reason="needs the default model")
def test_llama_cpp_runs_the_default_gguf(loaded):
    from specdec_kernels.models import default_gguf_path, encode_prompts

    prompt = encode_prompts(loaded.tokenizer, ["Name three fruits."])
    methods = build_methods(["llama-cpp", "llama-cpp-prompt-lookup"], loaded.model,
                            loaded.tokenizer, gguf_path=str(default_gguf_path()))
    plain = methods["llama-cpp"].run(prompt, 12, Sampling())
    lookup = methods["llama-cpp-prompt-lookup"].run(prompt, 12, Sampling())
    assert 1 <= plain.new_tokens <= 12 and plain.seconds > 0
    assert lookup.tokens == plain.tokens  # greedy: the drafter changes the speed only
