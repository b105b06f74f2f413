"""A direct forward of Llama-family decoders: the computation of transformers' own modules,
without the module machinery around them.

At batch 1 on a CPU the default model's decoding step spent more time in Python between the
ops than in the ops (``bench.step_breakdown``, 2026-11-26: 396 module calls a step through
transformers' decorators, output capture, mask and cache interfaces; then, without them, an
RMSNorm was still 14 aten calls). :class:`DirectForward` reads the model's parameters and
runs Llama, Mistral, Qwen2 and Qwen3 decoders (RMSNorm, rotary embedding from the model's own
``rotary_emb``, grouped-query attention, gated MLP) with the package's decoder-layer ops
(:mod:`specdec_kernels.ops.decoder_layer`: a norm fused with the residual add before it, the
rotary embedding of q and k in one pass, the SiLU gate): 2,966 aten calls a step of the
default model instead of 3,588.
Every result is bit-identical to the model's own forward with the same linears and attention
(the ops give the bits of the expressions they replace; tested per family, dtype, block kind
and weight format, with randomised norm weights), and every row is computed on its own, so a
row's result is the same bits in any block (batch-invariant, tested). A step costs about a
third less than the model's forward (``python3 -m bench.direct_forward``). The model is not
modified; its modules are found once, and a weight replaced (or registered anew) is seen on
the next call, one whose data was swapped in place after :meth:`DirectForward.refresh` (each
new cache).

The Python between those ops still cost as much as the quantized linears (2026-11-26, seventh
session: 4.6 ms of a 13.2 ms step on a 2-core Xeon). :meth:`DirectForward.stacked` runs all
layers in one :func:`specdec_kernels.ops.decoder_stack_` call on the package's KV cache: the
loop below, op for op, called from C++ (the same bits; tested against :meth:`__call__`).

What the caller supplies: a ``linear(x, weight, bias)`` (the package's CPU kernels, or
``F.linear``) and an ``attend(layer, q, k, v)`` that stores the block's K/V in its cache and
returns the attention output. Any architecture this module does not recognise is left to the
model's own forward (:func:`unsupported_reason` says why), and so is a forward while hooks are
registered on the model's modules (:meth:`DirectForward.hooked`: they would not run)."""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle

from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import QuantizedWeight, joined_rows

__all__ = ["DirectForward", "unsupported_reason"]

# How many parameters and buffers any module of this process has registered (setattr of a
# Parameter or buffer, register_parameter / register_buffer): while it stands still, no module
# weight was replaced, and DirectForward need not read every weight again to know that. Read
# per forward instead of ~270 weights and their dicts: after a forward has streamed the weights
# those Python objects are out of the caches, and reading them cost 0.14-0.25 ms a forward
# (2026-11-28, twenty-second session).
_registrations = [0]


def _count_registration(module, name, value):
    _registrations[0] += 1


nn_module.register_module_parameter_registration_hook(_count_registration)
nn_module.register_module_buffer_registration_hook(_count_registration)

#: Model types whose decoder layers this module reproduces, with the RMSNorm class each uses.
_FAMILIES = {
    "llama": "LlamaRMSNorm",
    "mistral": "MistralRMSNorm",
    "qwen2": "Qwen2RMSNorm",
    "qwen3": "Qwen3RMSNorm",
}


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def unsupported_reason(model) -> str | None:
    """Why :class:`DirectForward` cannot run ``model`` (None when it can).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM.

    Returns
    -------
    str or None
        A sentence naming what is not reproduced, or None.
    """
    config = _text_config(model.config)
    kind = getattr(config, "model_type", None)
    if kind not in _FAMILIES:
        return f"model type {kind!r} is not one of {sorted(_FAMILIES)}"
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None or not hasattr(decoder, "norm") or not hasattr(decoder, "rotary_emb"):
        return f"{type(decoder).__name__} has no layers / norm / rotary_emb"
    if model.get_output_embeddings() is None:
        return "the model has no LM head"
    if getattr(config, "final_logit_softcapping", None):
        return "final logit soft-capping is not reproduced"
    norm_class = _FAMILIES[kind]
    for index, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return f"decoder layer {index} has no self_attn / mlp"
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        if not all(isinstance(getattr(attn, n, None), torch.nn.Linear) for n in names):
            return f"layer {index}'s attention has no q/k/v/o linears"
        names = ("gate_proj", "up_proj", "down_proj")
        if not all(isinstance(getattr(mlp, n, None), torch.nn.Linear) for n in names):
            return f"layer {index}'s MLP is not gated (gate/up/down linears)"
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if any(type(n).__name__ != norm_class for n in norms):
            return f"layer {index} has a norm other than {norm_class}"
        if getattr(attn, "attention_dropout", 0.0) and attn.training:
            return "attention dropout in training mode"
    if type(decoder.norm).__name__ != norm_class:
        return f"the final norm is not {norm_class}"
    return None


def rms_norm(hidden: Tensor, norm: torch.nn.Module) -> Tensor:
    """The family's RMSNorm: :func:`specdec_kernels.ops.rms_norm` (one op, the same bits), or
    the module's own expression where the weight's dtype differs from the activations' (torch
    then promotes)."""
    weight = _weight(norm)
    if weight.dtype == hidden.dtype:
        return ops.rms_norm(hidden, weight, norm.variance_epsilon)
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + norm.variance_epsilon)).to(dtype)


def add_rms_norm(x: Tensor, residual: Tensor, norm: torch.nn.Module) -> tuple[Tensor, Tensor]:
    """``residual + x`` and its RMSNorm: :func:`specdec_kernels.ops.add_rms_norm` where the
    dtypes agree."""
    if x.dtype == residual.dtype == _weight(norm).dtype:
        return ops.add_rms_norm(x, residual, _weight(norm), norm.variance_epsilon)
    total = residual + x
    return total, rms_norm(total, norm)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x [B, T, H, D]`` and the model's ``cos``, ``sin``
    ``[B, T, D]``: :func:`specdec_kernels.ops.rotary_embedding` (bit-identical to the
    expression), or the expression itself where the dtypes differ."""
    if x.dtype == cos.dtype:
        return ops.rotary_embedding(x, cos, sin)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)


def _weight(module: torch.nn.Module) -> Tensor:
    """``module.weight`` without ``nn.Module.__getattr__`` (a parameter, or a buffer where the
    weight is held at a file's precision)."""
    weight = module._parameters.get("weight")
    return module._buffers["weight"] if weight is None else weight


def _linear_parts(module: torch.nn.Linear) -> tuple:
    return _weight(module), module._parameters.get("bias")


def _stack_entry(weight: Tensor, bias: Tensor | None, dtype: torch.dtype,
                 takes: Callable) -> list | None:
    """``[weight, scales, mins, bias]`` of one linear for
    :func:`~specdec_kernels.ops.decoder_stack_`: a weight at a file's precision as the
    quantized kernel's operands, a float one where ``takes(weight, bias, dtype)`` says the
    caller's linear runs :func:`~specdec_kernels.ops.small_batch_linear` on it, else None."""
    bias = None if bias is None else bias.detach()
    if isinstance(weight, QuantizedWeight):
        return [weight.qweight, weight.scales, weight.mins, bias]
    return [weight.detach(), None, None, bias] if takes(weight, bias, dtype) else None


class _Group:
    """Linears that read one input (a layer's q/k/v, gate/up). Where their weights are row
    blocks of one storage (:func:`~specdec_kernels.models.quantized_weight.lay_out_together`)
    one call computes them all, its output split by columns: bit-identical per column, one
    call's overhead and one quantization of the input instead of several."""

    __slots__ = ("modules", "_weights", "_joined", "_sizes")

    def __init__(self, modules):
        self.modules = modules
        self._weights, self._joined, self._sizes = (), None, []

    def __call__(self, x: Tensor, linear: Callable) -> list:
        """Each linear's output (columns of one output where the weights are joined)."""
        out = self.joined(x, linear)
        if out is None:
            return [linear(x, *_linear_parts(m)) for m in self.modules]
        return out.split(self.sizes, -1)

    def joined(self, x: Tensor, linear: Callable) -> Tensor | None:
        """``[..., sum N]`` every linear's output side by side, from one call; None where the
        weights are not row blocks of one storage (or only some linears have a bias)."""
        parts = [_linear_parts(m) for m in self.modules]
        weights = tuple(w for w, _ in parts)
        if len(weights) != len(self._weights) or any(a is not b for a, b in zip(weights, self._weights)):
            self._weights, self._joined = weights, joined_rows(weights)
            self._sizes = [w.shape[0] for w in weights]
        biases = [b for _, b in parts]
        if self._joined is None or (any(b is None for b in biases) and any(b is not None for b in biases)):
            return None
        bias = None if biases[0] is None else torch.cat(biases)
        return linear(x, self._joined, bias)

    @property
    def sizes(self) -> list:
        """Output columns of each linear (of the weights last seen)."""
        return self._sizes


class _Layer:
    """One decoder layer's modules, found once (their parameters are read on every call)."""

    __slots__ = ("input_norm", "post_norm", "qkv", "o", "gate_up", "down",
                 "q_norm", "k_norm", "head_dim", "scaling", "act", "silu")

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv, self.o = _Group((attn.q_proj, attn.k_proj, attn.v_proj)), attn.o_proj
        self.gate_up, self.down = _Group((mlp.gate_proj, mlp.up_proj)), mlp.down_proj
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.act = getattr(mlp.act_fn, "forward", mlp.act_fn)  # no hooks on an activation
        # transformers' SiLUActivation (ACT2FN["silu"]) or torch's SiLU.
        self.silu = type(mlp.act_fn).__name__ in ("SiLUActivation", "SiLU")

    def read_modules(self) -> tuple:
        """The modules whose weights :meth:`stack_linears` and the norms read."""
        return (self.input_norm, self.post_norm) + self.qkv.modules + (self.o,) + self.gate_up.modules + (self.down,)

    def gated(self, gate: Tensor, up: Tensor) -> Tensor:
        """``act(gate) * up``: :func:`specdec_kernels.ops.silu_mul` for SiLU (one op)."""
        if self.silu and gate.dtype == up.dtype:
            return ops.silu_mul(gate, up)
        return self.act(gate) * up

    def stack_linears(self, dtype: torch.dtype, takes: Callable) -> list | None:
        """This layer's :data:`~specdec_kernels.ops.decoder_layer.STACK_SLOTS_PER_LAYER`
        entries of :func:`~specdec_kernels.ops.decoder_stack_`'s ``linears`` for activations
        of ``dtype``, or None where the op would not run the layer as the Python loop does
        (Qwen3's per-head norms, an activation other than SiLU, a float weight the
        small-batch kernel does not take: ``takes(weight, bias, dtype)``, see
        :meth:`DirectForward.stacked`). Built from the weights as they are now (the caller,
        :meth:`DirectForward.stack_arguments`, keeps the result until one is replaced)."""
        modules = self.qkv.modules + (self.o,) + self.gate_up.modules + (self.down,)
        parts = [_linear_parts(m) for m in modules]
        if self.q_norm is not None or not self.silu:
            return None
        groups = [(self.qkv, parts[:3], 3), (None, parts[3:4], 1),
                  (self.gate_up, parts[4:6], 2), (None, parts[6:7], 1)]
        linears = []
        for group, members, width in groups:
            weights, biases = [w for w, _ in members], [b for _, b in members]
            joined = joined_rows(weights) if width > 1 else None
            if joined is not None and all(b is not None for b in biases):
                members = [(joined, torch.cat([b.detach() for b in biases]))]
            elif joined is not None and all(b is None for b in biases):
                members = [(joined, None)]
            for weight, bias in members:
                entry = _stack_entry(weight, bias, dtype, takes)
                if entry is None:
                    return None
                linears += entry
            linears += [None] * 4 * (width - len(members))
        return linears


class DirectForward:
    """The forward of a supported decoder (see :func:`unsupported_reason`) as plain tensor ops.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A Llama / Mistral / Qwen2 / Qwen3 causal LM; not modified.

    Raises
    ------
    ValueError
        The model is not supported (the message says why).
    """

    def __init__(self, model):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"DirectForward cannot run {type(model).__name__}: {reason}")
        self.model = model
        self.config = _text_config(model.config)
        decoder = model.get_decoder()
        self.decoder = decoder
        self.layers = [_Layer(layer) for layer in decoder.layers[: self.config.num_hidden_layers]]
        self.head = model.get_output_embeddings()
        self.num_layers = len(self.layers)
        windows = [getattr(layer.self_attn, "sliding_window", None) for layer in decoder.layers]
        if self.config.model_type == "mistral":  # Mistral's attention reads the config's
            windows = [getattr(self.config, "sliding_window", None)] * self.num_layers
        windows = [w for w in windows if w]
        self._modules = list(model.modules())
        # Every module's hook and weight dicts, read in one pass per forward (C-level maps: the
        # Python loops they replace cost ~0.5 ms of a 4.4 ms step at file precision, with the
        # interpreter's data evicted by the weight stream; bench/RESULTS.md 2026-11-27).
        self._hook_dicts = [d for m in self._modules for d in (m._forward_hooks, m._forward_pre_hooks)]
        read = [m for layer in self.layers for m in layer.read_modules()] + [decoder.norm]
        self._parameter_dicts = [m._parameters for m in read]
        self._buffer_dicts = [m._buffers for m in read]
        # (dtype, layers, takes) -> (stamp, weights, pointers, arguments)
        self._stack_cache: dict = {}
        self._epoch = 0  # bumped by refresh()
        self._unhooked_at = None  # RemovableHandle.next_id when no hook was found
        #: The smallest sliding window of any layer (None: every layer attends to all rows).
        self.window = min(windows) if windows else None
        #: Whether :meth:`stacked` may run the layers in one op (False: it declines, and the
        #: caller runs :meth:`__call__`'s Python loop; ``bench.direct_forward`` times both).
        self.one_op = True

    def _weights_seen(self) -> tuple:
        """The ``weight`` and ``bias`` entries (parameters and buffers) of every module
        :meth:`stack_arguments` reads, as objects (one replaced is another object), and the
        float ones' data pointers (``param.data = ...``, as ``module.to`` does, keeps the
        object)."""
        seen = list(map(dict.get, self._parameter_dicts, repeat("weight")))
        seen += map(dict.get, self._parameter_dicts, repeat("bias"))
        pointers = [t.data_ptr() for t in seen if t is not None]
        seen += map(dict.get, self._buffer_dicts, repeat("weight"))
        return seen, pointers

    def refresh(self) -> None:
        """Read every weight again at the next :meth:`stack_arguments`: what registrations do
        not announce (a weight's data swapped in place, ``param.data = ...`` as ``module.to``
        does, or a module's ``_parameters`` written directly) is seen from then on.
        :meth:`ModelRunner.new_cache <specdec_kernels.decoding.runner.ModelRunner.new_cache>`
        calls it, so every generation starts from the model as it is."""
        self._epoch += 1

    def stack_arguments(self, dtype: torch.dtype, layers: int, takes: Callable) -> tuple | None:
        """``(norms, linears, eps, scale)`` of the first ``layers`` layers for
        :func:`~specdec_kernels.ops.decoder_stack_` with activations of ``dtype``, or None where
        the op would not reproduce this forward's loop (see :meth:`_Layer.stack_linears`; norm
        weights of another dtype, norms or attention scales that differ between layers).
        Built again whenever a module's weight or bias was replaced since the last call (any
        parameter or buffer registration in the process makes it read every weight again),
        and after :meth:`refresh` if a weight's data was swapped in place."""
        key = (dtype, layers, takes)
        stamp = (_registrations[0], self._epoch)
        cached = self._stack_cache.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[3]
        seen, pointers = self._weights_seen()
        if cached is not None and cached[2] == pointers and all(map(operator.is_, seen, cached[1])):
            arguments = cached[3]
        else:
            arguments = self._build_stack_arguments(dtype, layers, takes)
        self._stack_cache[key] = (stamp, seen, pointers, arguments)
        return arguments

    def _build_stack_arguments(self, dtype: torch.dtype, layers: int, takes: Callable) -> tuple | None:
        chosen = self.layers[:layers]
        norm_modules = [chosen[0].input_norm if chosen else self.decoder.norm]
        for index, layer in enumerate(chosen):
            after = chosen[index + 1].input_norm if index + 1 < len(chosen) else self.decoder.norm
            norm_modules += [layer.post_norm, after]
        norms = [_weight(n) for n in norm_modules]
        eps = {n.variance_epsilon for n in norm_modules}
        scales = {layer.scaling for layer in chosen}
        heads = {layer.head_dim for layer in chosen}
        if (len(eps) != 1 or len(scales) > 1 or len(heads) > 1
                or any(w.dtype != dtype for w in norms)):
            return None
        linears = []
        for layer in chosen:
            entries = layer.stack_linears(dtype, takes)
            if entries is None:
                return None
            linears += entries
        return norms, linears, eps.pop(), scales.pop() if scales else 1.0

    def stacked(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        cache: dict,
        float_takes: Callable,
        *,
        head_linear: Callable = F.linear,
        stop_before: int | None = None,
        capture: tuple = (),
        last_only: bool = False,
    ) -> tuple[Tensor, dict] | None:
        """:meth:`__call__` with the layers in one :func:`~specdec_kernels.ops.decoder_stack_`
        call (the same ops, so the same bits) and the attention on the package's KV cache, or
        None where the op does not reproduce the loop (:meth:`stack_arguments`). Every linear
        runs the package's kernels: the caller takes this path only for blocks whose rows they
        would all take.

        Parameters
        ----------
        input_ids, position_ids : Tensor
            As :meth:`__call__`.
        cache : dict
            Where the block's K/V go and what it attends to: ``kv_cache``, ``write_start``,
            ``write_index``, ``kv_len``, ``cache_lens``, ``tree_mask`` as the op takes them.
        float_takes : callable
            ``float_takes(weight, bias, dtype)``: whether the caller's linear runs
            :func:`~specdec_kernels.ops.small_batch_linear` on that float weight for
            activations of ``dtype`` (it decides; where it would not, the loop runs). Weights at
            a file's precision always run :func:`~specdec_kernels.ops.quantized_linear`.
        head_linear : callable
            ``linear(x, weight, bias)`` for the LM head.
        stop_before, capture, last_only
            As :meth:`__call__` (capture points are decoder-layer indices and
            ``"final_norm"``).

        Returns
        -------
        tuple or None
            ``(logits, captured)`` as :meth:`__call__`.
        """
        if not self.one_op:
            return None
        hidden = self.decoder.embed_tokens(input_ids)
        layers = self.num_layers if stop_before is None else min(stop_before, self.num_layers)
        arguments = self.stack_arguments(hidden.dtype, layers, float_takes)
        if arguments is None:
            return None
        norms, linears, eps, scale = arguments
        cos, sin = self.decoder.rotary_emb(hidden, position_ids=position_ids)  # [B, T, D]
        if cos.dtype != hidden.dtype:
            return None
        points = [p for p in capture if p != "final_norm" and p < layers]
        config = self.config
        heads = config.num_attention_heads
        x, outputs = ops.decoder_stack_(
            hidden, cos, sin, cache["kv_cache"], cache["write_start"], cache["write_index"],
            cache["kv_len"], cache["cache_lens"], cache["tree_mask"], norms, linears, heads,
            getattr(config, "num_key_value_heads", None) or heads, scale, eps, capture=points,
        )
        captured = dict(zip(points, outputs))
        return self._logits(x, captured, head_linear, stop_before, capture, last_only)

    def _logits(self, x: Tensor, captured: dict, linear: Callable, stop_before, capture,
                last_only: bool) -> tuple[Tensor, dict]:
        """The LM head over ``x``, the final norm of every row (a per-row op: the last row alone
        gives the same bits), and ``"final_norm"`` added to ``captured`` where asked."""
        if stop_before is not None and last_only:
            x = x[:, -1:]
        if "final_norm" in capture:
            captured["final_norm"] = x
        if last_only and stop_before is None:
            x = x[:, -1:]
        return linear(x, *_linear_parts(self.head)), captured

    def hooked(self) -> bool:
        """Whether forward hooks are registered on the model's modules (or globally): the
        direct forward does not call modules, so such a forward belongs to the model's own.
        Every hook registration makes a :class:`~torch.utils.hooks.RemovableHandle` and
        advances its id counter: while that stands still since a look found none, none is."""
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            return True
        stamp = RemovableHandle.next_id
        if stamp == self._unhooked_at:
            return False
        found = any(map(len, self._hook_dicts))
        self._unhooked_at = None if found else stamp
        return found

    def covers(self, kv_len: int) -> bool:
        """Whether a forward attending to ``kv_len`` rows sees the same rows in every layer as
        full attention (no sliding window cuts them)."""
        return self.window is None or kv_len <= self.window

    def __call__(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        attend: Callable[[int, Tensor, Tensor, Tensor, float], Tensor],
        *,
        linear: Callable = F.linear,
        stop_before: int | None = None,
        capture: tuple = (),
        last_only: bool = False,
    ) -> tuple[Tensor, dict]:
        """Run the decoder over a block.

        Parameters
        ----------
        input_ids : Tensor
            ``[B, T]`` token ids.
        position_ids : Tensor
            ``[B, T]`` positions (for the rotary embedding).
        attend : callable
            ``attend(layer, q, k, v, scale)`` with ``q`` ``[B, T, Hq, D]`` and ``k``, ``v``
            ``[B, T, Hkv, D]`` (rotary embedding applied): stores the block's K/V and returns
            the attention output ``[B, T, Hq, D]``.
        linear : callable
            ``linear(x, weight, bias)``, as ``F.linear``.
        stop_before : int, optional
            Run layers ``< stop_before`` only; the final norm and the LM head read their output.
        capture : tuple
            Points whose outputs to return: decoder-layer indices (non-negative) and
            ``"final_norm"``.
        last_only : bool
            Logits of the last block row only.

        Returns
        -------
        logits : Tensor
            ``[B, T, V]`` (``[B, 1, V]`` with ``last_only``).
        captured : dict
            Point -> ``[B, T, H]`` output, for each point of ``capture``.
        """
        batch, width = input_ids.shape
        hidden = self.decoder.embed_tokens(input_ids)
        cos, sin = self.decoder.rotary_emb(hidden, position_ids=position_ids)  # [B, T, D]
        captured = {}
        layers = self.layers if stop_before is None else self.layers[:stop_before]
        # Each layer's residual add is fused with the norm that reads its result: the next
        # layer's input norm, after the last layer the final norm.
        next_norms = [layer.input_norm for layer in layers[1:]] + [self.decoder.norm]
        x = rms_norm(hidden, layers[0].input_norm if layers else self.decoder.norm)
        for index, layer in enumerate(layers):
            shape = (batch, width, -1, layer.head_dim)
            joined = None if layer.q_norm is not None else layer.qkv.joined(x, linear)
            if joined is not None:  # q and k side by side: one rotary pass for both (exact)
                nq, nk, _ = layer.qkv.sizes
                qk = rotate(joined[..., : nq + nk].view(shape), cos, sin)
                q, k = qk[:, :, : nq // layer.head_dim], qk[:, :, nq // layer.head_dim :]
                v = joined[..., nq + nk :].view(shape)
            else:
                q, k, v = (y.view(shape) for y in layer.qkv(x, linear))
                if layer.q_norm is not None:  # Qwen3: per-head norms before the rotary embedding
                    q, k = rms_norm(q, layer.q_norm), rms_norm(k, layer.k_norm)
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            out = attend(index, q, k, v, layer.scaling)
            attended = linear(out.reshape(batch, width, -1), *_linear_parts(layer.o))
            hidden, x = add_rms_norm(attended, hidden, layer.post_norm)
            gate, up = layer.gate_up(x, linear)
            mlp = linear(layer.gated(gate, up), *_linear_parts(layer.down))
            hidden, x = add_rms_norm(mlp, hidden, next_norms[index])
            if index in capture:
                captured[index] = hidden
        return self._logits(x, captured, linear, stop_before, capture, last_only)
