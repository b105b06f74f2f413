"""bench.synthetic_gguf: a file of a model's shape in llama.cpp's Q4_K_M mix with random
weights loads at its file's precision (Q6_K tensors as int8 panels in groups of 16, Q4_K as int4
panels), its weights dequantize to the float32 load's bit for bit, and its logits agree."""

import pytest
import torch

from python_tests.decoding_helpers import default_model_missing

pytestmark = [
    pytest.mark.default_model,
    pytest.mark.skipif(default_model_missing() is not None,
                       reason=f"the tokenizer comes from the default model: {default_model_missing()}"),
]


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    pytest.importorskip("gguf")
    from bench.synthetic_gguf import write

    path = tmp_path_factory.mktemp("synthetic") / "small.gguf"
    info = write(path, layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=49152 + 48)
    # Layer 1 is among llama.cpp's "more bits" layers: its v and down are Q6_K, as the embedding.
    assert info["tensors"] == {"Q4_K": 2 * 5 + 2, "Q6_K": 1 + 2}
    return path


def test_more_bits_follows_llama_cpp():
    from bench.synthetic_gguf import more_bits

    assert [i for i in range(28) if more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]


def test_loads_at_file_precision_and_matches_the_float32_load(small_file):
    from specdec_kernels.models import load_model
    from specdec_kernels.models.quantized_weight import QuantizedWeight

    file_precision = load_model(str(small_file), weights="file")
    dense = load_model(str(small_file), weights="float32")
    model = file_precision.model
    head = model.get_output_embeddings().weight
    assert isinstance(head, QuantizedWeight) and head.shape == (49200, 256)
    # Q6_K in int8 panels of groups of 16, its scales as the file holds them (K-quant form).
    assert head.qweight.dim() == 3 and head.group == 16
    assert head.scales.dtype == torch.int8 and head.scales.shape == (49200 // 16, 256 // 256, 8 * 32 + 32)
    down = model.model.layers[1].mlp.down_proj.weight
    assert down.group == 16 and down.qweight.dim() == 3
    weights = dict(dense.model.named_parameters())
    for name, weight in model.named_buffers():
        if isinstance(weight, QuantizedWeight) and name in weights:
            assert torch.equal(weight.dequantize(), weights[name]), name
    ids = torch.tensor([file_precision.tokenizer("A robot paints the sea.")["input_ids"]])
    with torch.inference_mode():
        got = model(ids).logits[0]
        want = dense.model(ids).logits[0]
    assert torch.isfinite(want).all()
    # Only the activations' int8 quantization (blocks of 32) differs.
    assert (got - want).abs().max() <= 0.1 * want.abs().max()
