"""Weights held at a GGUF file's precision inside an unmodified Hugging Face model.

A :class:`QuantizedWeight` stands where an ``nn.Linear`` or ``nn.Embedding`` keeps its
``weight``: it reports the logical shape ``[N, K]``, dtype and device of the dense weight but
holds only the operands of :func:`specdec_kernels.ops.quantized_linear` (int8 or packed int4
values, per-group scales and mins). ``F.linear`` on it runs that kernel, ``F.embedding``
dequantizes just the looked-up rows; any other use dequantizes (correct, slow, never on the
decoding path). No model class is patched: the weight tensors are swapped, and ``F.linear`` on
them reaches this class's ``__torch_function__``, inside the engine's forwards and outside alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "KQuantScales",
    "QuantizedWeight",
    "RerankedWeight",
    "joined_rows",
    "lay_out_projections",
    "lay_out_together",
    "pack_panels",
    "pack_model_panels",
    "quantize_model",
    "quantize_weight",
    "resident_bytes",
    "set_weight",
    "weight_rows",
]


@dataclass(frozen=True)
class KQuantScales:
    """A K-quant weight's scales as its file holds them (GGUF ``Q4_K``, ``Q5_K``, ``Q6_K``):
    ``scales = d * sub`` and ``mins = -(dmin * sub_mins)`` per group, with one float16 ``d``
    (``dmin``) per row and 256 values. :func:`pack_panels` keeps them so (int8 K-quant panel
    scales of :func:`~specdec_kernels.ops.quantized_linear`, about a sixth of float32 scales'
    bytes, the same bits).

    Attributes
    ----------
    sub : Tensor
        ``[N, K / G]`` int8 sub-scales.
    d : Tensor
        ``[N, K / 256]`` float16.
    sub_mins, dmin : Tensor, optional
        Likewise for the mins.
    """

    sub: Tensor
    d: Tensor
    sub_mins: Tensor | None = None
    dmin: Tensor | None = None


class QuantizedWeight(Tensor):
    """A dense ``[N, K]`` weight held as :func:`~specdec_kernels.ops.quantized_linear` operands.

    Parameters
    ----------
    qweight : Tensor
        ``[N, K]`` int8 or ``[N, K / 2]`` uint8 (packed int4, see the op), or on CPU in panels
        of 16 rows, ``[N / 16, K / 32, 256]`` uint8 (int4) or ``[N / 16, K / 32, 512]`` int8
        (:func:`pack_panels`).
    scales : Tensor
        ``[N, K / G]`` float32 or float16 (panels: ``[N / 16, K / 32, 16]``, or ``32`` in
        groups of 16; or int8 K-quant panel scales, see the op).
    mins : Tensor, optional
        Like ``scales``.
    kquant : KQuantScales, optional
        The scales' factors as a K-quant file holds them (row layout; :func:`pack_panels`
        packs them instead of the float scales).
    dtype : torch.dtype
        The dtype the weight presents (the activations' dtype): float32 or bfloat16.
    kind : str
        Where the values came from (``"Q4_1"``, ``"int4/g32"``, ...), for reports.
    """

    @staticmethod
    def __new__(cls, qweight: Tensor, scales: Tensor, mins: Tensor | None = None, *,
                dtype: torch.dtype = torch.float32, kind: str = "", kquant=None):
        if qweight.dim() == 3:  # panels
            shape = (qweight.shape[0] * PANEL_ROWS, qweight.shape[1] * PANEL_GROUP)
        else:
            shape = (qweight.shape[0], qweight.shape[1] * (2 if qweight.dtype == torch.uint8 else 1))
        return Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=qweight.device,
            requires_grad=False,
        )

    def __init__(self, qweight, scales, mins=None, *, dtype=torch.float32, kind="", kquant=None):
        self.qweight = qweight
        self.scales = scales
        self.mins = mins
        self.kind = kind
        self.kquant = kquant

    def __repr__(self):
        return (f"QuantizedWeight({self.kind or self.qweight.dtype}, shape={tuple(self.shape)}, "
                f"group={self.group}, dtype={self.dtype})")

    @property
    def group(self) -> int:
        """Values per scale along K."""
        if self.qweight.dim() == 3:  # panels: 16 scales (or 32, two per row) a block of 32
            return PANEL_GROUP * PANEL_ROWS // _panel_entries(self.scales)
        return self.shape[1] // self.scales.shape[1]

    @property
    def nbytes_resident(self) -> int:
        """Bytes held: values, scales and mins."""
        parts = [self.qweight, self.scales] + ([self.mins] if self.mins is not None else [])
        return sum(p.numel() * p.element_size() for p in parts)

    def linear(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``x @ W.T + bias`` through the quantized kernel (``x`` in this weight's dtype)."""
        from specdec_kernels import ops

        return ops.quantized_linear(x, self.qweight, self.scales, self.mins, bias)

    def dequantize(self, rows: Tensor | None = None) -> Tensor:
        """The dense weight (or only ``rows`` of it) in this weight's dtype."""
        from specdec_kernels.reference import dequantize_weight

        if rows is None:
            return dequantize_weight(self.qweight, self.scales, self.mins).to(self.dtype)
        qweight, scales, mins = self._row_parts(rows)
        return dequantize_weight(qweight, scales, mins).to(self.dtype)

    def _row_parts(self, rows: Tensor | None = None) -> tuple:
        """``(qweight, scales, mins)`` in the row layout, of ``rows`` only where given (a
        panel weight gathers just those rows' bytes)."""
        if self.qweight.dim() == 2:
            if rows is None:
                return self.qweight, self.scales, self.mins
            return self.qweight[rows], self.scales[rows], None if self.mins is None else self.mins[rows]
        if rows is None:
            from specdec_kernels.reference import unpack_panels

            return unpack_panels(self.qweight, self.scales, self.mins)
        panels, blocks, block_bytes = self.qweight.shape
        vectors = block_bytes // 64
        panel, lane = rows // PANEL_ROWS, rows % PANEL_ROWS
        qweight = self.qweight.view(panels, blocks, vectors, PANEL_ROWS, 4)[panel, :, :, lane, :]

        def per_row(t, negate=False):
            if t is None:
                return None
            if t.dtype == torch.int8:  # K-quant scales: expand just these rows' panels
                from specdec_kernels.reference import expand_kquant_scales

                t, at = expand_kquant_scales(t[panel], negate), torch.arange(len(panel))
            else:
                at = panel
            if t.shape[2] == 2 * PANEL_ROWS:  # two halves a block (groups of 16)
                return t.view(t.shape[0], blocks, 2, PANEL_ROWS)[at, :, :, lane].reshape(rows.shape[0], -1)
            return t[at, :, lane]

        return (qweight.reshape(rows.shape[0], blocks * vectors * 4), per_row(self.scales),
                per_row(self.mins, negate=True))

    def _with(self, **changes) -> "QuantizedWeight":
        parts = dict(qweight=self.qweight, scales=self.scales, mins=self.mins)
        device = changes.pop("device", None)
        if device is not None:
            if torch.device(device).type != "cpu" and self.qweight.dim() == 3:
                # the panel layout is the CPU kernel's: other devices get the rows back
                parts = dict(zip(("qweight", "scales", "mins"), self._row_parts()))
            parts = {k: None if v is None else v.to(device) for k, v in parts.items()}
        return QuantizedWeight(parts["qweight"], parts["scales"], parts["mins"],
                               dtype=changes.get("dtype", self.dtype), kind=self.kind,
                               kquant=None if device is not None else self.kquant)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if isinstance(weight, QuantizedWeight) and not isinstance(x, QuantizedWeight):
                return weight.linear(x, bias)
        if func is F.embedding:
            ids, weight = args[0], args[1]
            if isinstance(weight, QuantizedWeight) and not kwargs.get("max_norm"):
                flat = ids.reshape(-1)
                return weight.dequantize(flat).view(*ids.shape, weight.shape[1])
        if func is Tensor.to and isinstance(args[0], QuantizedWeight):
            device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            self = args[0]
            changes = {}
            if device is not None and torch.device(device) != self.device:
                changes["device"] = device
            if dtype is not None and dtype != self.dtype:
                changes["dtype"] = dtype
            return self._with(**changes) if changes else self
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return args[0]

        def dense(value):
            return value.dequantize() if isinstance(value, QuantizedWeight) else value

        args = torch.utils._pytree.tree_map(dense, args)
        kwargs = torch.utils._pytree.tree_map(dense, kwargs)
        return func(*args, **kwargs)


#: Columns per block of :func:`top_columns`.
TOP_BLOCK = 128


def top_columns(logits: Tensor, k: int) -> Tensor:
    """The columns of the ``k`` largest values of each row, as ``logits.topk(k).indices``
    (in another order, and where values tie, possibly other columns of the same value).

    Each row's blocks of :data:`TOP_BLOCK` columns are ranked by their maxima, then the best
    ``k`` values are taken within the ``k`` best blocks: every one of the ``k`` largest values
    lies in one of them (a block holding one has a maximum at least as large, and fewer than
    ``k`` other blocks can have a larger one). A 49152-column row took 45 us with ``topk``,
    22 us so (2026-11-28). Rows whose width the blocks do not fit take ``topk`` itself.

    Parameters
    ----------
    logits : Tensor
        ``[..., V]``.
    k : int
        Columns per row, ``1 <= k <= V``.

    Returns
    -------
    Tensor
        ``[..., k]`` int64 column indices.
    """
    columns = logits.shape[-1]
    if columns % TOP_BLOCK or columns < 4 * k * TOP_BLOCK:
        return logits.topk(k, dim=-1).indices
    blocks = logits.unflatten(-1, (columns // TOP_BLOCK, TOP_BLOCK))
    best = blocks.amax(-1).topk(k, dim=-1).indices  # [..., k] blocks
    within = blocks.gather(-2, best.unsqueeze(-1).expand(*best.shape, TOP_BLOCK)).flatten(-2)
    pick = within.topk(k, dim=-1).indices  # [..., k] of the k blocks' columns
    return best.gather(-1, pick // TOP_BLOCK) * TOP_BLOCK + pick % TOP_BLOCK


class RerankedWeight(QuantizedWeight):
    """A coarse quantized LM head whose ``candidates`` best logits of every row are computed
    again with exact (dense) rows: ``x @ W.T`` through :func:`~specdec_kernels.ops.quantized_linear`,
    then, at each row's top ``candidates`` columns, ``x . exact[column]`` (plus the bias).

    For a drafter's head: the copy's int4 head reads half the bytes of an int8 one, and its
    top few candidates almost always hold the dense head's best token, so re-scoring them with
    the target's own rows (shared, no copy) brings the argmax back to the dense head's (the
    default model's int4 copy, 768 teacher-forced positions: the next token agreed with the
    target's on 90.9% with the int4 head, 97.4% int8, 97.9% dense, and 97.9% with the int4
    head's top 4 re-scored). Every step is per row: a row's logits do not depend on its batch.

    Parameters
    ----------
    coarse : QuantizedWeight
        ``[N, K]`` the quantized head.
    exact : Tensor
        ``[N, K]`` dense rows of the same head, in ``coarse``'s dtype and device.
    candidates : int
        Columns re-scored per row.
    """

    @staticmethod
    def __new__(cls, coarse: QuantizedWeight, exact: Tensor, candidates: int):
        return QuantizedWeight.__new__(cls, coarse.qweight, coarse.scales, coarse.mins,
                                       dtype=coarse.dtype)

    def __init__(self, coarse: QuantizedWeight, exact: Tensor, candidates: int):
        super().__init__(coarse.qweight, coarse.scales, coarse.mins, dtype=coarse.dtype,
                         kind=coarse.kind, kquant=coarse.kquant)
        if exact.shape != coarse.shape or exact.dtype != coarse.dtype or exact.device != coarse.device:
            raise ValueError(
                f"exact rows must match the coarse head ({tuple(coarse.shape)}, {coarse.dtype}, "
                f"{coarse.device}), got {tuple(exact.shape)}, {exact.dtype}, {exact.device}")
        if not 1 <= candidates <= coarse.shape[0]:
            raise ValueError(f"candidates must be in [1, {coarse.shape[0]}], got {candidates}")
        self.exact, self.candidates = exact, int(candidates)

    def __repr__(self):
        return f"RerankedWeight({super().__repr__()}, candidates={self.candidates})"

    def linear(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        logits = super().linear(x, bias)  # a new tensor: re-scored in place
        top = top_columns(logits, self.candidates)  # [..., C]
        exact = (self.exact[top] * x.unsqueeze(-2)).sum(-1)  # [..., C]: one row's sums each
        if bias is not None:
            exact = exact + bias[top]
        return logits.scatter_(-1, top, exact.to(logits.dtype))

    def _with(self, **changes) -> QuantizedWeight:
        coarse = QuantizedWeight._with(self, **changes)
        exact = self.exact.to(device=coarse.device, dtype=coarse.dtype)
        return RerankedWeight(coarse, exact, self.candidates)


def set_weight(module: nn.Module, weight: Tensor, name: str = "weight") -> None:
    """Put ``weight`` (a :class:`QuantizedWeight` or a dense tensor) where ``module`` keeps its
    ``name`` parameter: quantized weights become buffers (they are not trainable), dense ones
    parameters."""
    if name in module._parameters:
        del module._parameters[name]
    if name in module._buffers:
        del module._buffers[name]
    if isinstance(weight, QuantizedWeight):
        module.register_buffer(name, weight, persistent=False)
    else:
        module.register_parameter(name, nn.Parameter(weight, requires_grad=False))


def quantize_weight(weight: Tensor, bits: int, group: int) -> QuantizedWeight:
    """Quantize a dense ``[N, K]`` weight in groups of ``group`` values along K.

    ``bits=4``: asymmetric (``Q4_1``-like: ``scale = (max - min) / 15``, ``min``), values
    0..15 packed as :func:`~specdec_kernels.ops.quantized_linear` reads them. ``bits=8``:
    symmetric (``Q8_0``-like: ``scale = amax / 127``). Scales and mins are float16.

    Raises
    ------
    ValueError
        ``bits`` not 4 or 8, or ``group`` not a power of two (>= 32 for 4 bits, >= 16 for 8)
        dividing K.
    """
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    n, k = weight.shape
    smallest = 32 if bits == 4 else 16
    if group < smallest or group & (group - 1) or k % group:
        raise ValueError(
            f"group must be a power of two >= {smallest} dividing K = {k} for {bits}-bit "
            f"weights, got {group}"
        )
    w = weight.detach().float().view(n, k // group, group)
    if bits == 8:
        amax = w.abs().amax(-1)
        scales = (amax / 127).half()
        inverse = torch.where(scales > 0, 1 / scales.float(), torch.zeros_like(amax))
        q = torch.round(w * inverse[..., None]).clamp(-127, 127).to(torch.int8).view(n, k)
        return QuantizedWeight(q, scales, None, dtype=weight.dtype, kind=f"int8/g{group}")
    low, high = w.amin(-1), w.amax(-1)
    scales = ((high - low) / 15).half()
    mins = low.half()
    inverse = torch.where(scales > 0, 1 / scales.float(), torch.zeros_like(low))
    q = torch.round((w - mins.float()[..., None]) * inverse[..., None]).clamp(0, 15).to(torch.uint8)
    return QuantizedWeight(pack_int4(q.view(n, k)), scales, mins, dtype=weight.dtype,
                           kind=f"int4/g{group}")


#: Weight rows per panel and values per group of the panel layout (ops.quantized_linear).
PANEL_ROWS, PANEL_GROUP = 16, 32


def pack_panels(weight: QuantizedWeight) -> QuantizedWeight:
    """``weight`` in the CPU kernel's panel layout where it fits (int4 or int8 in groups of 32,
    int8 in groups of 16 without mins (a ``Q6_K``'s sub-blocks: two scales per row and block),
    ``N`` a multiple of 16, on CPU), else ``weight`` itself. Values, scales and mins are only
    moved (:func:`specdec_kernels.reference.unpack_panels` is the inverse): the kernel
    multiplies 16 weight rows per instruction there, about 2x faster than the row layout at
    every batch size on the AVX-512 path of the Zen 5 of bench/RESULTS.md, with other rounding
    (the results are not the row layout's bits, and are the same on every instruction set)."""
    q = weight.qweight
    if q.dim() != 2:
        return weight
    halves = q.dtype == torch.int8 and weight.group == PANEL_GROUP // 2 and weight.mins is None
    if (q.dtype not in (torch.uint8, torch.int8)
            or not (weight.group == PANEL_GROUP or halves)
            or weight.shape[0] % PANEL_ROWS or weight.shape[1] % PANEL_GROUP
            or q.device.type != "cpu"):
        return weight
    panels, blocks = weight.shape[0] // PANEL_ROWS, weight.shape[1] // PANEL_GROUP
    vectors = 4 if q.dtype == torch.uint8 else 8  # of 16 rows x 4 bytes per block
    packed = q.reshape(panels, PANEL_ROWS, blocks, vectors, 4).permute(0, 2, 3, 1, 4)
    packed = packed.reshape(panels, blocks, 64 * vectors)

    def per_panel(t):
        if t is None:
            return None
        if halves:  # [N, 2 K / 32] -> [panels, blocks, 2 (half), 16 (row)]
            return t.reshape(panels, PANEL_ROWS, blocks, 2).permute(0, 2, 3, 1).reshape(
                panels, blocks, 2 * PANEL_ROWS).contiguous()
        return t.reshape(panels, PANEL_ROWS, blocks).permute(0, 2, 1).contiguous()

    k = weight.kquant if weight.shape[1] % (PANEL_GROUP * K_SUPER_BLOCK) == 0 else None
    if k is None:
        scales, mins = per_panel(weight.scales), per_panel(weight.mins)
    else:  # the file's factors instead of the float scales they encode
        scales = _kquant_panel_scales(k.sub, k.d, panels, PANEL_ROWS * PANEL_GROUP // weight.group)
        mins = None if weight.mins is None else _kquant_panel_scales(k.sub_mins, k.dmin, panels, PANEL_ROWS)
    return QuantizedWeight(packed.contiguous(), scales, mins, dtype=weight.dtype, kind=weight.kind)


#: Blocks of 32 per K-quant super-block of 256 values.
K_SUPER_BLOCK = 8


def _kquant_panel_scales(sub: Tensor, d: Tensor, panels: int, entries: int) -> Tensor:
    """Row-layout K-quant factors (``sub [N, K / G]`` int8, ``d [N, K / 256]`` float16) in the
    op's int8 K-quant panel layout ``[N / 16, K / 256, 8 E + 32]`` (``E`` = entries a block)."""
    supers = d.shape[1]
    halves = entries // PANEL_ROWS  # 1, or 2 in groups of 16
    blocks = sub.reshape(panels, PANEL_ROWS, supers, K_SUPER_BLOCK, halves)
    blocks = blocks.permute(0, 2, 3, 4, 1).reshape(panels, supers, K_SUPER_BLOCK * entries)
    supers_d = d.reshape(panels, PANEL_ROWS, supers).permute(0, 2, 1).contiguous().view(torch.int8)
    return torch.cat([blocks.to(torch.int8), supers_d], dim=-1).contiguous()


def _panel_entries(scales: Tensor) -> int:
    """Scale entries a block of a panel weight's ``scales`` has (16, or 32 in groups of 16)."""
    if scales.dtype == torch.int8:  # K-quant: 8 blocks' entries and 32 bytes of super-scales
        return (scales.shape[2] - 32) // K_SUPER_BLOCK
    return scales.shape[2]


def pack_model_panels(model: nn.Module) -> int:
    """Every quantized weight of ``model`` that fits the panel layout (:func:`pack_panels`)
    replaced by its packed form, in place, tied weights staying tied. Call it before
    :func:`lay_out_projections` (which joins the packed weights alike). Returns how many
    weights were packed."""
    packed: dict = {}
    for module in model.modules():
        for name, buf in list(module._buffers.items()):
            if not isinstance(buf, QuantizedWeight):
                continue
            if id(buf) not in packed:
                packed[id(buf)] = pack_panels(buf)
            if packed[id(buf)] is not buf:
                set_weight(module, packed[id(buf)], name)
    return sum(1 for key, w in packed.items() if id(w) != key)


def weight_rows(weight: Tensor, ids: Tensor) -> Tensor:
    """Rows ``ids`` of a linear's weight ``[N, K]`` as a weight ``[len(ids), K]`` of its own
    (an LM head over a draft vocabulary). A :class:`QuantizedWeight` keeps those rows' values,
    scales and mins as they are (in the kernel's panels where they fit): for 4096 rows of the
    default model's file-precision head, 4 ms once and 2.5 MB (a product then reads a quarter
    of the dense rows' bytes), where dequantizing the whole head to take them took 77 ms and
    kept 9.4 MB of float32 rows.

    Parameters
    ----------
    weight : Tensor
        ``[N, K]`` dense or :class:`QuantizedWeight`.
    ids : Tensor
        ``[M]`` int64 row ids in ``[0, N)``.

    Returns
    -------
    Tensor
        ``[M, K]``: a dense copy, or a :class:`QuantizedWeight` of ``weight``'s dtype (a
        :class:`RerankedWeight` over those rows for one).
    """
    ids = ids.to(weight.device)
    if isinstance(weight, QuantizedWeight):
        qweight, scales, mins = weight._row_parts(ids)
        rows = pack_panels(QuantizedWeight(qweight, scales, mins, dtype=weight.dtype,
                                           kind=weight.kind))
        if isinstance(weight, RerankedWeight):  # those rows, still re-scored
            return RerankedWeight(rows, weight.exact[ids], min(weight.candidates, len(ids)))
        return rows
    return weight.detach()[ids].clone()


def pack_int4(values: Tensor) -> Tensor:
    """``[N, K]`` values 0..15 to the packed ``[N, K / 2]`` uint8 layout (per block of 32:
    byte ``j`` = value ``j`` | value ``j + 16`` << 4)."""
    n, k = values.shape
    blocks = values.to(torch.uint8).view(n, k // 32, 2, 16)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)


def quantize_model(model: nn.Module, bits: int, group: int) -> nn.Module:
    """Every ``nn.Linear`` weight of ``model`` (in place) replaced by its :func:`quantize_weight`;
    tied weights stay tied (one quantized copy). Embeddings and norms are untouched. A layer's
    q/k/v and gate/up weights end up in one storage each (:func:`lay_out_projections`).

    Linears whose K is not a multiple of ``group`` keep their dense weight.
    """
    done: dict = {}
    for module in model.modules():
        if not isinstance(module, nn.Linear) or isinstance(module.weight, QuantizedWeight):
            continue
        weight = module.weight
        if weight.shape[1] % group:
            continue
        key = id(weight)
        if key not in done:
            done[key] = quantize_weight(weight, bits, group)
        set_weight(module, done[key])
    pack_model_panels(model)
    lay_out_projections(model)
    return model


def resident_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor counted once (tied weights and
    views of one storage alike); quantized weights count what they hold."""
    seen: set = set()
    total = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if isinstance(tensor, QuantizedWeight):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.nbytes_resident
            continue
        key = tensor.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += tensor.untyped_storage().nbytes()
    return total


def _parts(weight: QuantizedWeight) -> list:
    return [weight.qweight, weight.scales] + ([weight.mins] if weight.mins is not None else [])


def _compatible(weights) -> bool:
    first = weights[0]
    return all(
        isinstance(w, QuantizedWeight) and w.dtype == first.dtype and w.shape[1] == first.shape[1]
        and w.qweight.dtype == first.qweight.dtype and w.qweight.dim() == first.qweight.dim()
        and w.scales.dtype == first.scales.dtype
        and w.group == first.group and (w.mins is None) == (first.mins is None)
        and w.device == first.device
        for w in weights
    )


def lay_out_together(modules: list) -> bool:
    """Put the quantized weights of ``modules`` in one storage, each module's weight a view of
    its rows in order, so that :func:`joined_rows` sees them as one weight: a decoder layer's
    q/k/v (or gate/up) projections read the same input, and one kernel call for all of them
    costs one call's overhead and quantizes the input once. Values are unchanged.

    Returns
    -------
    bool
        Whether it did (the weights must be quantized alike: format, group, K, dtype).
    """
    weights = [m.weight for m in modules]
    if len(weights) < 2 or not _compatible(weights):
        return False
    joined = [torch.cat(parts) for parts in zip(*(_parts(w) for w in weights))]
    begin = 0
    for module, weight in zip(modules, weights):
        # rows of the row layout, panels of 16 rows of the panel layout: the leading dimension
        lead = slice(begin, begin + weight.qweight.shape[0])
        views = [j[lead] for j in joined] + ([None] if weight.mins is None else [])
        set_weight(module, QuantizedWeight(*views, dtype=weight.dtype, kind=weight.kind))
        begin += weight.qweight.shape[0]
    return True


def joined_rows(weights) -> QuantizedWeight | None:
    """``weights`` as one ``[sum N, K]`` weight when they are consecutive row blocks of one
    storage (:func:`lay_out_together`), else None. The kernel's result for each row block is
    bit-identical to that weight's own (its output columns are independent)."""
    if not _compatible(weights):
        return None
    for a, b in zip(weights, weights[1:]):
        for pa, pb in zip(_parts(a), _parts(b)):
            if (not pa.is_contiguous() or not pb.is_contiguous()
                    or pa.untyped_storage().data_ptr() != pb.untyped_storage().data_ptr()
                    or pa.data_ptr() + pa.nbytes != pb.data_ptr()):
                return None
    lead = sum(w.qweight.shape[0] for w in weights)  # rows, or panels of the panel layout
    views = [p.as_strided((lead, *p.shape[1:]), p.stride()) for p in _parts(weights[0])]
    first = weights[0]
    return QuantizedWeight(*views, *([None] if first.mins is None else []),
                           dtype=first.dtype, kind=first.kind)


#: Sibling linears that read the same input in the decoder layers of most families.
PROJECTION_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def lay_out_projections(model: nn.Module) -> int:
    """:func:`lay_out_together` for every group of :data:`PROJECTION_GROUPS` found in
    ``model``'s modules (quantized alike). Returns how many groups were laid out."""
    done = 0
    for module in model.modules():
        for names in PROJECTION_GROUPS:
            linears = [getattr(module, n, None) for n in names]
            if all(isinstance(m, nn.Linear) for m in linears):
                done += lay_out_together(linears)
    return done
