"""GGUF blocks repacked exactly into quantized_linear's formats (against the gguf package's own
dequantization), the default model at its file's precision (weights bit-identical to the
float32 conversion, logits within the activation-quantization tolerance, lossless speculative
greedy decoding, resident size), and bad input."""

import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from python_tests.decoding_helpers import default_model_missing
from specdec_kernels.models.gguf_weights import REPACKED_TYPES, repack
from specdec_kernels.models.quantized_weight import QuantizedWeight, resident_bytes

# Bytes per block and where its fp16 fields sit (set to finite values: random bytes would
# give NaN/Inf scales).
BLOCKS = {"Q8_0": (34, [0]), "Q4_0": (18, [0]), "Q4_1": (20, [0, 2]),
          "Q5_0": (22, [0]), "Q5_1": (24, [0, 2]), "Q4_K": (144, [0, 2]),
          "Q5_K": (176, [0, 2]), "Q6_K": (210, [208])}


def random_blocks(kind, rows, columns, seed=0):
    gguf = pytest.importorskip("gguf")

    size, halves = BLOCKS[kind]
    values_per_block = 256 if kind.endswith("_K") else 32
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, columns // values_per_block, size), dtype=np.uint8)
    for at in halves:
        d = rng.uniform(-0.05, 0.05, raw.shape[:2]).astype(np.float16)
        raw[..., at : at + 2] = d.view(np.uint8).reshape(*raw.shape[:2], 2)
    qtype = gguf.GGMLQuantizationType[kind]
    tensor = SimpleNamespace(tensor_type=qtype, shape=np.array([columns, rows]),
                             data=raw.reshape(rows, -1))
    return tensor, gguf.quants.dequantize(raw.reshape(rows, -1), qtype)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_repack_is_exact(kind):
    tensor, want = random_blocks(kind, rows=3, columns=512)
    weight = repack(tensor)
    assert isinstance(weight, QuantizedWeight) and weight.shape == (3, 512)
    _, bits, group = REPACKED_TYPES[kind]
    assert weight.group == group
    assert (weight.qweight.dtype == torch.uint8) == (bits == 4)
    assert torch.equal(weight.dequantize(), torch.from_numpy(want.astype(np.float32)))


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_keep_their_factors_in_panels(kind):
    """K-quant scales pack as the file holds them (int8 sub-scales, a float16 d per 256
    values): the same dequantized weight and the same kernel bits as float32 scales, in fewer
    bytes."""
    from specdec_kernels import ops
    from specdec_kernels.models.quantized_weight import pack_panels

    tensor, want = random_blocks(kind, rows=32, columns=512, seed=3)
    weight = repack(tensor)
    assert weight.kquant is not None
    compact = pack_panels(weight)
    plain = pack_panels(QuantizedWeight(weight.qweight, weight.scales, weight.mins))
    assert compact.scales.dtype == torch.int8 and plain.scales.dtype == torch.float32
    assert torch.equal(compact.dequantize(), torch.from_numpy(want.astype(np.float32)))
    assert compact.nbytes_resident < plain.nbytes_resident
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ops.quantized_linear(x, compact.qweight, compact.scales, compact.mins),
                       ops.quantized_linear(x, plain.qweight, plain.scales, plain.mins))


def test_permuted_k_quant_rows_keep_their_factors():
    """Q/K rows that transformers permutes on load (llama's rotary layout) take their K-quant
    factors along."""
    from specdec_kernels.models.gguf_weights import _permute_rows
    from specdec_kernels.models.quantized_weight import pack_panels

    tensor, want = random_blocks("Q4_K", rows=32, columns=512, seed=4)
    order = np.random.default_rng(0).permutation(32)
    compact = pack_panels(_permute_rows(repack(tensor), order))
    assert compact.scales.dtype == torch.int8
    assert torch.equal(compact.dequantize(), torch.from_numpy(want.astype(np.float32))[order])


def test_dense_types_stay_dense():
    gguf = pytest.importorskip("gguf")

    data = np.arange(6, dtype=np.float32)
    tensor = SimpleNamespace(tensor_type=gguf.GGMLQuantizationType.F32, shape=np.array([6]), data=data)
    out = repack(tensor)
    assert not isinstance(out, QuantizedWeight) and out.tolist() == data.tolist()


def test_bad_weights_mode():
    from specdec_kernels.models import load_model

    with pytest.raises(ValueError, match="weights must be one of"):
        load_model("default", weights="int3")


# ---------------------------------------------------------------------------- default model

pytestmark_default = pytest.mark.skipif(default_model_missing() is not None,
                                        reason=f"needs the bundled default model: {default_model_missing()}")


@pytest.fixture(scope="module")
def file_precision():
    from specdec_kernels.models import load_model

    return load_model("default", weights="file")


@pytestmark_default
@pytest.mark.default_model
def test_default_model_weights_are_the_files(file_precision, loaded):
    """Every quantized weight dequantizes bit for bit to the float32 conversion's weight."""
    model = file_precision.model
    dense = dict(loaded.model.named_parameters())
    quantized = {n: b for n, b in model.named_buffers() if isinstance(b, QuantizedWeight)}
    assert len(quantized) == 211  # 30 layers x 7 linears + the Q8_0 embedding (tied LM head)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for name, weight in quantized.items():
        assert torch.equal(weight.dequantize(), dense[name]), name
    # Resident: the file's blocks (Q4_1 / Q8_0, fp16 scales) and the fp32 norms; no fp32 copy.
    assert resident_bytes(model) < 100e6 < resident_bytes(loaded.model) / 5


PROMPT = ("Write a short story about a robot who learns to paint. The robot lives in a small "
          "town by the sea and every morning it watches the fishermen leave the harbour.")


@pytestmark_default
@pytest.mark.default_model
def test_default_model_logits_within_tolerance(file_precision, loaded):
    """Same weights; only the activations' int8 quantization (blocks of 32) differs: logits
    within 10% of their largest magnitude, and the same top-1 token wherever the float32
    model's top two logits are more than 1.0 apart."""
    ids = torch.tensor([file_precision.tokenizer(PROMPT)["input_ids"]])
    with torch.inference_mode():
        got = file_precision.model(ids).logits[0]
        want = loaded.model(ids).logits[0]
    assert (got - want).abs().max() <= 0.1 * want.abs().max()
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1.0
    assert clear.sum() >= 10
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


@pytestmark_default
@pytest.mark.default_model
@pytest.mark.parametrize("drafter", ["prompt-lookup", "self-speculative", "quantized-self"])
def test_speculative_greedy_equals_plain_greedy(file_precision, drafter):
    from specdec_kernels.decoding import generate
    from specdec_kernels.decoding.api import make_drafter

    prompts = [PROMPT, "List three colours of the rainbow and repeat them twice."]
    plain = generate(file_precision.model, prompts, tokenizer=file_precision.tokenizer,
                     max_new_tokens=24, drafter=None)
    spec = generate(file_precision.model, prompts, tokenizer=file_precision.tokenizer,
                    max_new_tokens=24, drafter=make_drafter(drafter))
    assert spec.tokens == plain.tokens


@pytestmark_default
@pytest.mark.default_model
@pytest.mark.parametrize("options", [dict(bits=4, group=32), dict(bits=8, group=16), dict(gguf=True)])
def test_quantized_self_on_the_float32_target(loaded, options):
    """The compressed prophet (an int4/int8 copy, or the GGUF file's own weights) drafting for
    the float32 target: the target's own greedy output."""
    from specdec_kernels.decoding import QuantizedSelfDrafter, generate
    from specdec_kernels.models import default_gguf_path

    if options.get("gguf"):
        options = dict(gguf=str(default_gguf_path()))
    prompts = [PROMPT]
    plain = generate(loaded.model, prompts, tokenizer=loaded.tokenizer, max_new_tokens=24)
    out = generate(loaded.model, prompts, tokenizer=loaded.tokenizer, max_new_tokens=24,
                   drafter=QuantizedSelfDrafter(num_draft=3, **options))
    assert out.tokens == plain.tokens
    assert out.stats.tau > 1.5  # it agrees with the target most of the time


# ------------------------------------------------------------------ the file's tensor index


def write_small_gguf(path, rows=48, columns=64):
    """A GGUF file of one float32, one float16 and one Q8_0 tensor (odd row count)."""
    gguf = pytest.importorskip("gguf")

    writer = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(columns + 3).astype(np.float32))
    writer.add_tensor("half.weight", rng.standard_normal((5, columns)).astype(np.float16))
    blocks, _ = random_blocks("Q8_0", rows + 1, columns)
    writer.add_tensor("q8.weight", blocks.data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_file_tensors_are_the_readers_and_cached(tmp_path, monkeypatch):
    """The tensors (names, types, shapes, data bytes) are what gguf's reader gives; the second
    read comes from the cached index without the reader; an index that is corrupt, of another
    version or that does not fit the file is read again, not trusted."""
    gguf = pytest.importorskip("gguf")
    from specdec_kernels.models import loading
    from specdec_kernels.models.gguf_weights import file_tensors

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_small_gguf(tmp_path / "small.gguf")
    reader = gguf.GGUFReader(str(path))

    def same_as_reader(result):
        architecture, tensors = result
        assert architecture == "llama"
        assert [t.name for t in tensors] == [t.name for t in reader.tensors]
        for got, want in zip(tensors, reader.tensors):
            assert got.tensor_type == want.tensor_type
            assert list(got.shape) == [int(d) for d in want.shape]
            assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape
            assert np.array_equal(got.data, want.data)
            # The repacked weight is the same either way.
            a, b = repack(got), repack(want)
            assert torch.equal(a.dequantize() if isinstance(a, QuantizedWeight) else a,
                               b.dequantize() if isinstance(b, QuantizedWeight) else b)

    calls = []
    check = loading.check_gguf_file
    monkeypatch.setattr(loading, "check_gguf_file", lambda p: calls.append(p) or check(p))
    same_as_reader(file_tensors(path))
    assert len(calls) == 1
    same_as_reader(file_tensors(path))
    assert len(calls) == 1  # from the index
    (index_file,) = (tmp_path / "cache" / "gguf-index").glob("*.json")
    text = index_file.read_text()
    for broken in ("{", text.replace('"version": 1', '"version": 0'),
                   text.replace('"offset": ', '"offset": 1000000')):
        assert broken != text
        index_file.write_text(broken)
        same_as_reader(file_tensors(path))
        assert index_file.read_text() == text  # written again whole
    assert len(calls) == 4
    # A cache that cannot be written: read by the reader every time, and loaded all the same.
    index_file.unlink()
    monkeypatch.setattr(tempfile, "mkstemp", lambda **kw: (_ for _ in ()).throw(PermissionError(kw["dir"])))
    same_as_reader(file_tensors(path))
    assert len(calls) == 5 and not index_file.exists()


def test_file_tensors_of_a_changed_file_are_read_again(tmp_path, monkeypatch):
    """The index is keyed by the file's size and mtime: a file written again is read again,
    and one cut short since is named as truncated."""
    pytest.importorskip("gguf")
    from specdec_kernels.models.gguf_weights import file_tensors

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_small_gguf(tmp_path / "small.gguf", rows=48)
    assert file_tensors(path)[1][2].data.shape == (49, 68)  # Q8_0 rows of 2 blocks of 34 bytes
    write_small_gguf(path, rows=80)
    assert file_tensors(path)[1][2].data.shape == (81, 68)
    cut = path.read_bytes()[:-100]
    path.write_bytes(cut)
    with pytest.raises(ValueError, match="small.gguf is truncated"):
        file_tensors(path)
