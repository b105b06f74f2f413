"""A GGUF model at its file's precision: the quantized blocks repacked, exactly, into the
operands of :func:`specdec_kernels.ops.quantized_linear`, never dequantized to float32.

Formats (``w`` the value the file encodes; every product below is exact in float32):

====== ========================================= ================================================
type   file block                                kernel operands
====== ========================================= ================================================
Q8_0   32 x int8, fp16 ``d``: ``w = d q``         int8, group 32, scale ``d`` (fp16)
Q4_0   32 x 4 bit, fp16 ``d``: ``w = d (q - 8)``  int4, group 32, scale ``d``, min ``-8 d`` (fp16)
Q4_1   32 x 4 bit, fp16 ``d, m``: ``w = d q + m`` int4, group 32, scale ``d``, min ``m`` (fp16)
Q5_0   32 x 5 bit, fp16 ``d``: ``w = d (q - 16)`` int8 (-16..15), group 32, scale ``d``
Q5_1   32 x 5 bit, fp16 ``d, m``: ``w = d q + m`` int8 (0..31), group 32, scale ``d``, min ``m``
Q4_K   256 = 8 sub-blocks of 32, 6-bit ``sc, mn``, int4, group 32, scale ``d sc``, min ``-dmin mn``
       fp16 ``d, dmin``: ``w = d sc q - dmin mn`` (float32: 17 significant bits)
Q5_K   as Q4_K with 5-bit values                 int8 (0..31), group 32, as Q4_K
Q6_K   256 = 16 sub-blocks of 16, int8 ``sc``,   int8 (-32..31), group 16, scale ``d sc`` (float32)
       fp16 ``d``: ``w = d sc (q - 32)``
====== ========================================= ================================================

Other quantized types are dequantized (float32) with the ``gguf`` package and stay dense;
float tensors (norms; unquantized embeddings) are kept as the file has them, in the model's
dtype. Q/K rows that transformers permutes on load (llama's rotary layout) are permuted here
too, by the same processor, applied to row indices.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from specdec_kernels.models.quantized_weight import (
    KQuantScales,
    QuantizedWeight,
    lay_out_projections,
    pack_model_panels,
    set_weight,
)

__all__ = ["REPACKED_TYPES", "FileTensor", "file_tensors", "load_gguf_model", "repack"]


def _f16(raw: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 at byte ``offset`` of every block (``raw [..., block_bytes]``), as float32."""
    return raw[..., offset : offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _blocks(data: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(data).reshape(rows, -1, block_bytes)


def _half_if_exact(values: np.ndarray) -> torch.Tensor:
    """float16 where every value survives the round trip (halves the bytes), else float32."""
    half = values.astype(np.float16)
    if np.array_equal(half.astype(np.float32), values) and np.isfinite(half).all():
        return torch.from_numpy(half)
    return torch.from_numpy(values.astype(np.float32))


def _scales_and_mins(scales: np.ndarray, mins: np.ndarray | None):
    """One dtype for both (the kernel takes them alike)."""
    s = _half_if_exact(scales)
    if mins is None:
        return s, None
    m = _half_if_exact(mins)
    if s.dtype != m.dtype:
        s, m = s.float(), m.float()
    return s, m


def _pack_nibbles(values: np.ndarray) -> np.ndarray:
    """``[N, B, 32]`` values 0..15 per block of 32 -> ``[N, B * 16]`` bytes (byte j: value j
    low, value j + 16 high)."""
    return (values[..., :16] | (values[..., 16:] << 4)).astype(np.uint8).reshape(values.shape[0], -1)


def _q8_0(data, rows):
    b = _blocks(data, rows, 34)
    q = b[..., 2:].copy().view(np.int8).reshape(rows, -1)
    return torch.from_numpy(q), *_scales_and_mins(_f16(b, 0), None)


def _q4_0(data, rows):
    b = _blocks(data, rows, 18)
    d = _f16(b, 0)
    return torch.from_numpy(b[..., 2:].reshape(rows, -1).copy()), *_scales_and_mins(d, -8.0 * d)


def _q4_1(data, rows):
    b = _blocks(data, rows, 20)
    return torch.from_numpy(b[..., 4:].reshape(rows, -1).copy()), *_scales_and_mins(_f16(b, 0), _f16(b, 2))


def _five_bit(b: np.ndarray, high_at: int) -> np.ndarray:
    """Q5_0 / Q5_1 values 0..31 of each block: low nibbles of qs (values 0..15, then 16..31
    from the high nibbles) and the fifth bits from the little-endian uint32 at ``high_at``."""
    qh = b[..., high_at : high_at + 4].copy().view("<u4")[..., 0]
    bits = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    qs = b[..., high_at + 4 :]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | (bits << 4)


def _q5_0(data, rows):
    b = _blocks(data, rows, 22)
    values = (_five_bit(b, 2).astype(np.int16) - 16).astype(np.int8).reshape(rows, -1)
    return torch.from_numpy(values), *_scales_and_mins(_f16(b, 0), None)


def _q5_1(data, rows):
    b = _blocks(data, rows, 24)
    values = _five_bit(b, 4).astype(np.int8).reshape(rows, -1)
    return torch.from_numpy(values), *_scales_and_mins(_f16(b, 0), _f16(b, 2))


def _k_factors(sc: np.ndarray, d: np.ndarray, mn=None, dmin=None) -> KQuantScales:
    """The file's own factors of a K-quant weight's scales and mins (sub-scales as int8, one
    float16 ``d`` / ``dmin`` per row and 256 values), for the panel layout."""
    rows = sc.shape[0]

    def sub(v):
        return torch.from_numpy(np.ascontiguousarray(v.astype(np.int8)).reshape(rows, -1))

    def half(v):
        return torch.from_numpy(np.ascontiguousarray(v.astype(np.float16)).reshape(rows, -1))

    if mn is None:
        return KQuantScales(sub(sc), half(d))
    return KQuantScales(sub(sc), half(d), sub(mn), half(dmin))


def _k_scales(packed: np.ndarray):
    """The eight 6-bit (scale, min) pairs of a Q4_K / Q5_K block's 12 scale bytes."""
    p = packed.astype(np.uint8)
    sc = np.empty(p.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = p[..., 0:4] & 63
    mn[..., :4] = p[..., 4:8] & 63
    sc[..., 4:] = (p[..., 8:12] & 0x0F) | ((p[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (p[..., 8:12] >> 4) | ((p[..., 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(data, rows):
    b = _blocks(data, rows, 144)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales(b[..., 4:16])
    qs = b[..., 16:].reshape(rows, -1, 4, 32)  # 4 chunks of 64 values: low nibbles, then high
    values = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, -1, 32)  # sub-blocks of 32
    scales = (d[..., None] * sc).reshape(rows, -1)
    mins = (-(dmin[..., None] * mn)).reshape(rows, -1)
    return (torch.from_numpy(_pack_nibbles(values)), *_scales_and_mins(scales, mins),
            _k_factors(sc, d, mn, dmin))


def _q5_k(data, rows):
    b = _blocks(data, rows, 176)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales(b[..., 4:16])
    qh = b[..., 16:48]  # bit 2j / 2j + 1 of byte l: the fifth bit of sub-block 2j / 2j + 1
    qs = b[..., 48:].reshape(rows, -1, 4, 32)
    bits = ((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(rows, -1, 4, 2, 32)
    low = (qs & 0x0F) | (bits[..., 0, :] << 4)
    high = (qs >> 4) | (bits[..., 1, :] << 4)
    values = np.stack([low, high], axis=3).reshape(rows, -1).astype(np.int8)
    scales = (d[..., None] * sc).reshape(rows, -1)
    mins = (-(dmin[..., None] * mn)).reshape(rows, -1)
    return torch.from_numpy(values), *_scales_and_mins(scales, mins), _k_factors(sc, d, mn, dmin)


def _q6_k(data, rows):
    b = _blocks(data, rows, 210)
    ql = b[..., :128].reshape(rows, -1, 2, 64)  # two halves of 128 values
    qh = b[..., 128:192].reshape(rows, -1, 2, 32)
    sc = b[..., 192:208].copy().view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    # Per half: values l, l + 32, l + 64, l + 96 (l < 32) from ql[l], ql[l + 32] (low, then
    # high nibbles) and the 2-bit pairs 0, 2, 4, 6 of qh[l].
    lo4 = np.concatenate([ql & 0x0F, ql >> 4], axis=-1)  # [.., 128]: ql low (64), ql high (64)
    hi2 = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)  # [.., 128]
    values = (lo4 | (hi2 << 4)).astype(np.int16) - 32
    scales = (d[..., None] * sc).reshape(rows, -1)
    return (torch.from_numpy(values.reshape(rows, -1).astype(np.int8)), *_scales_and_mins(scales, None),
            _k_factors(sc, d))


#: GGUF type name -> (repacker, bits, group).
REPACKED_TYPES = {
    "Q8_0": (_q8_0, 8, 32),
    "Q4_0": (_q4_0, 4, 32),
    "Q4_1": (_q4_1, 4, 32),
    "Q5_0": (_q5_0, 8, 32),
    "Q5_1": (_q5_1, 8, 32),
    "Q4_K": (_q4_k, 4, 32),
    "Q5_K": (_q5_k, 8, 32),
    "Q6_K": (_q6_k, 8, 16),
}


def repack(tensor, dtype: torch.dtype = torch.float32):
    """One tensor of a GGUF file (:class:`FileTensor`, or a ``gguf.GGUFReader``'s): a
    :class:`QuantizedWeight` for the types of
    :data:`REPACKED_TYPES` (2-D), else a dense tensor in ``dtype`` (float types as stored;
    other quantized types dequantized by the ``gguf`` package)."""
    kind = tensor.tensor_type.name
    shape = [int(s) for s in reversed(tensor.shape)]  # GGUF lists the fastest dimension first
    if kind in REPACKED_TYPES and len(shape) == 2:
        fn, _, _ = REPACKED_TYPES[kind]
        qweight, scales, mins, *factors = fn(tensor.data, shape[0])  # K-quants: their factors
        return QuantizedWeight(qweight, scales, mins, dtype=dtype, kind=kind,
                               kquant=factors[0] if factors else None)
    from gguf.quants import dequantize

    values = np.asarray(tensor.data)
    if kind not in ("F32", "F16", "BF16", "F64"):
        values = dequantize(values, tensor.tensor_type)
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape)).to(dtype)


def _permute_rows(weight, order: np.ndarray):
    if isinstance(weight, QuantizedWeight):
        idx = torch.from_numpy(order)

        def rows(t):
            return None if t is None else t[idx].contiguous()

        k = weight.kquant
        kquant = None if k is None else KQuantScales(rows(k.sub), rows(k.d), rows(k.sub_mins), rows(k.dmin))
        return QuantizedWeight(rows(weight.qweight), rows(weight.scales), rows(weight.mins),
                               dtype=weight.dtype, kind=weight.kind, kquant=kquant)
    return weight[torch.from_numpy(order)].contiguous()


def _processed(processor, name: str, values: np.ndarray) -> np.ndarray:
    out = processor.process(weights=values, name=name, tensor_key_mapping={},
                            parsed_parameters={"config": processor.config, "tensors": {}})
    return np.asarray(out.weights).reshape(values.shape)


def _row_order(processor, name: str, rows: int) -> np.ndarray | None:
    """The row permutation transformers' processor applies to ``name`` (None: none), found
    by running the processor on row indices."""
    index = np.arange(rows, dtype=np.float64)[:, None]
    try:
        out = processor.process(weights=index.copy(), name=name, tensor_key_mapping={},
                                parsed_parameters={"config": processor.config, "tensors": {}})
    except Exception:  # a processor that needs more than an index column: no permutation known
        return None
    moved = np.asarray(out.weights).reshape(-1)
    if moved.shape[0] != rows or np.array_equal(moved, index[:, 0]):
        return None
    return moved.astype(np.int64)


class FileTensor(NamedTuple):
    """One tensor of a GGUF file as ``gguf.GGUFReader`` gives it (the fields :func:`repack`
    reads): ``shape`` fastest dimension first, ``data`` the file's bytes (typed for float and
    integer types, ``uint8`` blocks for quantized ones), mapped from the file."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple
    data: np.ndarray


_INDEX_VERSION = 1


def file_tensors(path: str | Path) -> tuple[str, list[FileTensor]]:
    """``(architecture, tensors)`` of a GGUF file.

    ``gguf``'s reader takes seconds to open a file (it parses the tokenizer's ~100k strings one
    by one), so what it found (names, types, shapes, where each tensor's data lies, as the
    reader typed it) is cached under :func:`~specdec_kernels.models.loading.cache_dir`, keyed
    by the file's path, size and mtime like the converted copy, and later loads map the data
    straight from the file. A read without a usable index goes through
    :func:`~specdec_kernels.models.loading.check_gguf_file`, which names a truncated or corrupt
    file.
    """
    from gguf import GGMLQuantizationType

    from specdec_kernels.models.loading import cache_dir, converted_gguf_dir

    path = Path(path)
    index_file = cache_dir() / "gguf-index" / f"{converted_gguf_dir(path).name}.json"
    index = _read_index(index_file, path.stat().st_size)
    if index is None:
        index = _write_index(path, index_file)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for t in index["tensors"]:
        data = mapped[t["offset"]:_data_end(t)].view(t["dtype"]).reshape(t["data_shape"])
        tensors.append(FileTensor(t["name"], GGMLQuantizationType(t["type"]), tuple(t["shape"]), data))
    return index["architecture"], tensors


def _data_end(entry: dict) -> int:
    """The byte after an index entry's tensor data."""
    return entry["offset"] + int(np.prod(entry["data_shape"])) * np.dtype(entry["dtype"]).itemsize


def _read_index(index_file: Path, file_bytes: int) -> dict | None:
    """The cached index, or ``None`` where there is none or it does not fit the file."""
    import json

    try:
        index = json.loads(index_file.read_text())
        if index["version"] != _INDEX_VERSION or not isinstance(index["architecture"], str):
            return None
        for t in index["tensors"]:
            if not 0 <= t["offset"] <= _data_end(t) <= file_bytes:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return index


def _write_index(path: Path, index_file: Path) -> dict:
    """Reads the file with ``gguf``'s reader (checked whole) and caches what it found where the
    cache can be written (the index only saves time)."""
    import json
    import os
    import tempfile

    from specdec_kernels.models.loading import check_gguf_file

    reader = check_gguf_file(path)
    index = {
        "version": _INDEX_VERSION,
        "architecture": str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8"),
        "tensors": [{"name": t.name, "type": int(t.tensor_type), "shape": [int(d) for d in t.shape],
                     "offset": int(t.data_offset), "dtype": t.data.dtype.str,
                     "data_shape": list(t.data.shape)}
                    for t in reader.tensors],
    }
    tmp = None
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=index_file.name, dir=index_file.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(index, f)
        os.replace(tmp, index_file)  # concurrent loads write the same index; one lands whole
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return index


def load_gguf_model(path: str | Path, *, dtype: torch.dtype = torch.float32, device="cpu",
                    attn_implementation: str | None = None):
    """``(model, tokenizer)`` of a GGUF file with its weights at the file's precision.

    The model is built by transformers from the file's config on the meta device, then every
    tensor of the file is put in place: :data:`REPACKED_TYPES` as :class:`QuantizedWeight`,
    the rest dense in ``dtype``. A tied LM head shares the embedding's weight.

    Raises
    ------
    ValueError
        The file's architecture is not one transformers reads from GGUF, or a model tensor
        has no counterpart in the file.
    """
    from transformers import AutoModelForCausalLM
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path = Path(path)
    architecture, tensors = file_tensors(path)  # first: a bad file is named as such
    config, tokenizer, parsed = _config_and_tokenizer(path)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    from accelerate import init_empty_weights

    # Parameters on the meta device (no float32 copy is ever made), buffers (rotary tables,
    # embedding scales) computed as the model's own code computes them.
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    processor = gguf_utils.TENSOR_PROCESSORS.get(architecture, gguf_utils.TensorProcessor)(config=parsed)
    names = _names(model, architecture, config) or gguf_utils.get_gguf_hf_weights_map(model, processor)
    placed: dict = {}
    for tensor in tensors:
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        weight = repack(tensor, dtype)
        if isinstance(weight, QuantizedWeight):
            # Only a row permutation can be applied to blocks; find it on row indices.
            order = _row_order(processor, tensor.name, weight.shape[0])
            if order is not None:
                weight = _permute_rows(weight, order)
        else:  # dense: whatever transformers does to it (e.g. Gemma's norm offset)
            weight = torch.from_numpy(np.array(_processed(processor, tensor.name, weight.float().numpy()))).to(dtype)
        placed[hf_name] = weight
    _place(model, placed, device)
    pack_model_panels(model)  # int4 in the CPU kernel's panels of 16 rows
    lay_out_projections(model)  # a layer's q/k/v and gate/up run as one kernel call each
    model.eval()
    return model, tokenizer


def _names(model: nn.Module, architecture: str, config) -> dict:
    """GGUF tensor name -> HF parameter name through the ``gguf`` package's one name map of
    the architecture (what transformers' ``get_gguf_hf_weights_map`` does, without rebuilding
    the map per module); empty when some parameter has no GGUF name."""
    import gguf

    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == architecture), None)
    if arch is None:
        return {}
    name_map = gguf.get_tensor_name_map(arch, int(config.num_hidden_layers))
    names = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        base, _, suffix = hf_name.rpartition(".")
        found = name_map.get_name(base)
        if found is None:
            if model.get_output_embeddings() is not None and base.endswith("lm_head"):
                continue  # tied LM head: filled from the embedding
            return {}
        names[f"{found}.{suffix}"] = hf_name
    return names


_META_COMPLETE = "gguf-meta.json"


def _config_and_tokenizer(path: Path):
    """The file's HF config, tokenizer and transformers' parsed GGUF config, read once and
    cached (a few kB) under :func:`~specdec_kernels.models.loading.cache_dir`: parsing the
    tokenizer from GGUF takes seconds."""
    import json
    import os
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from specdec_kernels.models.loading import cache_dir, converted_gguf_dir

    folder = cache_dir() / "gguf-meta" / converted_gguf_dir(path).name
    if not (folder / _META_COMPLETE).is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name,
                                                local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                                      local_files_only=True)
        parsed = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
        try:
            config.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
            (tmp / _META_COMPLETE).write_text(json.dumps(parsed, default=str))
            try:
                os.rename(tmp, folder)
            except OSError:
                if not (folder / _META_COMPLETE).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return config, tokenizer, json.loads((folder / _META_COMPLETE).read_text())


def _place(model: nn.Module, placed: dict, device) -> None:
    """Put the loaded tensors into the model (parameters on the meta device); tie the LM head
    when the file has no separate output weight; move the model's own buffers to ``device``."""
    modules = dict(model.named_modules())
    for name, weight in placed.items():
        owner, _, attr = name.rpartition(".")
        set_weight(modules[owner], weight.to(device), attr)
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    if head is not None and head.weight.is_meta and not embed.weight.is_meta:
        set_weight(head, embed.weight)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"GGUF file has no tensor for {missing[:5]} ({len(missing)} in all)")
    for module in model.modules():
        for name, buf in list(module._buffers.items()):
            if buf is not None and not isinstance(buf, QuantizedWeight):
                module._buffers[name] = buf.to(device)
