"""Typed wrappers of the decoder-layer glue ops (``csrc/decoder_layer.cpp``,
``csrc/cuda/decoder_layer.cu``): the RMSNorm, residual add + RMSNorm, rotary embedding and
SiLU gate that sit between a Llama-family layer's linears, one op each.

At batch 1 on a CPU the torch expressions of these cost more in dispatch than in arithmetic
(an RMSNorm is 14 aten calls); :class:`~specdec_kernels.models.direct_forward.DirectForward`
runs them through these ops. On CPU each op returns the bits of the torch expression it
replaces (the reference's), so the direct forward is bit-identical to the model's own: the
element-wise work is done in torch's order and roundings, and the two steps whose bits depend
on torch's vector code (the norms' row sums of squares, SiLU's exp) call torch itself. Each row
is computed on its own, so a row's result is the same alone or in any batch (batch-invariant).
On CUDA they run the torch expressions of the reference.

The fake (meta) kernels are registered right after the wrappers; the executable specification
is the function of the same name in :mod:`specdec_kernels.reference`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["STACK_LINEARS", "STACK_SLOTS_PER_LAYER", "add_rms_norm", "decoder_stack_", "rms_norm",
           "rotary_embedding", "silu_mul"]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension, as Llama, Mistral and Qwen compute it.

    ``weight * to_dtype(x * rsqrt(mean(x ** 2) + eps))`` with the statistics in float32:
    bit-identical to that torch expression (the row sums of squares are torch's own sum; the
    rest is done here in its order and roundings), in one call instead of 14.

    Parameters
    ----------
    x : Tensor
        ``[..., H]`` float32, bfloat16 or float16.
    weight : Tensor
        ``[H]``, ``x``'s dtype and device.
    eps : float
        Added to the mean square.

    Returns
    -------
    Tensor
        ``[..., H]`` contiguous, ``x``'s dtype.

    Raises
    ------
    ValueError
        A weight whose shape, dtype or device does not match ``x``; an unsupported dtype.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops, reference
    >>> x, w = torch.randn(3, 10), torch.rand(10)
    >>> torch.equal(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    True
    """
    return torch.ops.specdec.rms_norm(x, weight, float(eps))


@torch.library.register_fake("specdec::rms_norm")
def _rms_norm_fake(x, weight, eps):
    torch._check(weight.shape == x.shape[-1:], lambda: "weight must be [H] for x [..., H]")
    return x.new_empty(x.shape)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The residual add and the next RMSNorm in one op: ``total = x + residual`` (in ``x``'s
    dtype) and :func:`rms_norm` of ``total``.

    Parameters
    ----------
    x, residual : Tensor
        ``[..., H]``, same shape, dtype and device (float32, bfloat16 or float16).
    weight : Tensor
        ``[H]``, ``x``'s dtype.
    eps : float

    Returns
    -------
    total : Tensor
        ``[..., H]`` contiguous: ``x + residual``, bit-identical to torch's sum.
    normed : Tensor
        ``[..., H]`` contiguous: ``rms_norm(total, weight, eps)``, bit for bit.

    Raises
    ------
    ValueError
        Shapes, dtypes or devices that do not match.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> x, r, w = torch.randn(2, 8), torch.randn(2, 8), torch.ones(8)
    >>> total, normed = ops.add_rms_norm(x, r, w, 1e-6)
    >>> torch.equal(total, x + r), torch.equal(normed, ops.rms_norm(x + r, w, 1e-6))
    (True, True)
    """
    return torch.ops.specdec.add_rms_norm(x, residual, weight, float(eps))


@torch.library.register_fake("specdec::add_rms_norm")
def _add_rms_norm_fake(x, residual, weight, eps):
    torch._check(residual.shape == x.shape, lambda: "residual must have x's shape")
    torch._check(weight.shape == x.shape[-1:], lambda: "weight must be [H] for x [..., H]")
    return x.new_empty(x.shape), x.new_empty(x.shape)


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding in the rotate-half form of Hugging Face's Llama family:
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``.

    ``cos`` and ``sin`` are what the model's own ``rotary_emb`` returns (any RoPE scaling is
    already in them). Each product and the sum are rounded to ``x``'s dtype as torch's
    expression rounds them: the result is bit-identical to it.

    Parameters
    ----------
    x : Tensor
        ``[B, T, H, D]`` float32, bfloat16 or float16, ``D`` even; the last dimension
        contiguous, other strides free (query and key heads side by side in one projection's
        output are fine).
    cos, sin : Tensor
        ``[B, T, D]`` (or ``[1, T, D]``), ``x``'s dtype.

    Returns
    -------
    Tensor
        ``[B, T, H, D]`` contiguous.

    Raises
    ------
    ValueError
        Shapes, dtypes or devices that do not match; an odd ``D``.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops, reference
    >>> x = torch.randn(1, 3, 2, 8)
    >>> angle = torch.arange(3.0)[:, None] * torch.ones(8)
    >>> cos, sin = angle.cos()[None], angle.sin()[None]
    >>> torch.equal(ops.rotary_embedding(x, cos, sin), reference.rotary_embedding(x, cos, sin))
    True
    """
    return torch.ops.specdec.rotary_embedding(x, cos, sin)


@torch.library.register_fake("specdec::rotary_embedding")
def _rotary_embedding_fake(x, cos, sin):
    torch._check(x.dim() == 4, lambda: "x must be [B, T, H, D]")
    return x.new_empty(x.shape)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """The gated MLP's activation: ``silu(gate) * up``, bit-identical to that torch expression
    on a contiguous ``gate`` (torch's own SiLU, rounded to the dtype before the product).

    Parameters
    ----------
    gate, up : Tensor
        ``[..., I]``, same shape, dtype and device (float32, bfloat16 or float16); last
        dimension contiguous (the two halves of one joined gate/up projection are fine).

    Returns
    -------
    Tensor
        ``[..., I]`` contiguous.

    Raises
    ------
    ValueError
        Shapes, dtypes or devices that do not match.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> gate_up = torch.randn(2, 16)
    >>> out = ops.silu_mul(gate_up[:, :8], gate_up[:, 8:])
    >>> torch.equal(out, torch.nn.functional.silu(gate_up[:, :8].contiguous()) * gate_up[:, 8:])
    True
    """
    return torch.ops.specdec.silu_mul(gate, up)


@torch.library.register_fake("specdec::silu_mul")
def _silu_mul_fake(gate, up):
    torch._check(up.shape == gate.shape, lambda: "up must have gate's shape")
    return gate.new_empty(gate.shape)


#: Entries of one layer in :func:`decoder_stack_`'s ``linears``: 7 linears (q, k, v, o, gate,
#: up, down) of 4 parts each (weight, scales, mins, bias).
STACK_LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
STACK_SLOTS_PER_LAYER = 4 * len(STACK_LINEARS)


def decoder_stack_(
    hidden: Tensor,
    cos: Tensor,
    sin: Tensor,
    kv_cache: Tensor,
    write_start: int,
    write_index: Tensor | None,
    kv_len: int,
    cache_lens: Tensor,
    tree_mask: Tensor,
    norms: list,
    linears: list,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    eps: float,
    capture=(),
) -> tuple[Tensor, list]:
    """A Llama-family model's decoder layers over one block, in one call: each layer's linears,
    rotary embedding, K/V cache write, tree attention, norms and SiLU gate, as
    :class:`~specdec_kernels.models.direct_forward.DirectForward` runs them from Python, op for
    op (the same ops on the same operands in the same order: bit-identical, batch-invariant).

    At batch 1 on a CPU the Python between a step's ~360 ops cost as much as its linears; this
    composite calls them from C++. Where every linear is a float32 or a panel weight and the
    activations are float32 on CPU (not while tracing), it goes further: the linears and the
    glue ops' arithmetic run on buffers reused by every layer, without a dispatch or an
    allocation per op (the same kernels, so the same bits; csrc/decoder_stack.cpp). Per layer
    ``l`` (``L`` layers)::

        q, k, v = linear(x, q/k/v); q, k = rotary(q), rotary(k)      # joined or separate
        kv_cache[l, 0 | 1, :, :, rows] = k | v                         # the block's rows
        out = tree_attention(q, kv_cache[l, 0, ..., :kv_len, :], ...)  # and values
        hidden, x = add_rms_norm(linear(out, o), hidden, norms[1 + 2 l])
        hidden, x = add_rms_norm(linear(silu_mul(gate(x), up(x)), down), hidden, norms[2 + 2 l])

    Parameters
    ----------
    hidden : Tensor
        ``[B, T, H]`` the block's embeddings (float32 or bfloat16).
    cos, sin : Tensor
        ``[B, T, D]`` the model's rotary embedding of the block's positions, ``hidden``'s dtype.
    kv_cache : Tensor
        ``[>= L, 2, B, Hkv, S, D]`` (:attr:`KVCache.buffer
        <specdec_kernels.decoding.cache.KVCache.buffer>`): layer ``l``'s keys and values. The
        block's K/V are written (in place) at rows ``write_start .. write_start + T - 1`` of
        every request, or at ``write_index``. ``hidden``'s dtype, or bfloat16/float16 under
        float32 ``hidden`` on CPU (the K/V rounded as they are written; see
        :func:`~specdec_kernels.ops.tree_attention`).
    write_start : int
        First row of the block (every request), when ``write_index`` is None.
    write_index : Tensor, optional
        ``[B, T]`` int64: the row of each block token (ragged batches).
    kv_len : int
        Rows attended: ``kv_cache[..., :kv_len, :]`` (``T <= kv_len <= S``).
    cache_lens, tree_mask : Tensor
        As :func:`~specdec_kernels.ops.tree_attention`'s: ``[B]`` prefix rows, ``[B, T,
        ceil(T / 32)]`` int32 packed mask.
    norms : list of Tensor
        ``2 L + 1`` RMSNorm weights ``[H]``: layer 0's input norm, then per layer its
        post-attention norm and the norm after it (the next layer's input norm; the final norm
        after the last layer).
    linears : list of Tensor or None
        ``28 L`` entries (:data:`STACK_SLOTS_PER_LAYER` a layer): per layer the linears q, k, v,
        o, gate, up, down (:data:`STACK_LINEARS`), each as ``weight, scales, mins, bias``. With
        ``scales`` the linear is :func:`~specdec_kernels.ops.quantized_linear` (``weight`` its
        ``qweight``), without it :func:`~specdec_kernels.ops.small_batch_linear`. ``k`` and
        ``v`` absent (all four None): ``q``'s weight holds q, k and v row blocks (one call);
        ``up`` absent: ``gate``'s holds gate and up.
    num_heads, num_kv_heads : int
        Query and KV heads (``Hq``, ``Hkv``); the head dim ``D`` is ``kv_cache``'s last.
    scale : float
        Softmax scale of the attention.
    eps : float
        The norms' epsilon.
    capture : sequence of int
        Layers whose output hidden state to return.

    Returns
    -------
    normed : Tensor
        ``[B, T, H]``: the last norm's output (the LM head's input).
    captured : list of Tensor
        ``[B, T, H]`` hidden state after each layer of ``capture``, in its order.

    Raises
    ------
    ValueError
        Lists of the wrong length, a missing weight, a cache, index or ``kv_len`` that does not
        fit the block, a capture point outside the layers, and whatever the inner ops raise.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels import ops
    >>> gen = torch.Generator().manual_seed(0)
    >>> B, T, H, D, Hq, Hkv, S = 1, 2, 16, 8, 2, 1, 10
    >>> w = lambda n, k: torch.randn(n, k, generator=gen) / k**0.5
    >>> linears = [w(Hq * D, H), None, None, None, w(Hkv * D, H), None, None, None,
    ...            w(Hkv * D, H), None, None, None, w(H, Hq * D), None, None, None,
    ...            w(32, H), None, None, None, w(32, H), None, None, None,
    ...            w(H, 32), None, None, None]
    >>> cache = torch.zeros(1, 2, B, Hkv, S, D)
    >>> tree = ops.build_tree_masks(torch.tensor([[-1, 0]]), torch.tensor([3]))
    >>> angle = torch.arange(3.0, 5.0)[:, None] * torch.ones(D)
    >>> x, captured = ops.decoder_stack_(
    ...     torch.randn(B, T, H, generator=gen), angle.cos()[None], angle.sin()[None], cache,
    ...     3, None, 5, torch.tensor([3]), tree.packed_mask, [torch.ones(H)] * 3, linears,
    ...     Hq, Hkv, D**-0.5, 1e-6, capture=[0])
    >>> x.shape, len(captured), bool(cache[0, :, 0, :, 3:5].abs().sum() > 0)
    (torch.Size([1, 2, 16]), 1, True)
    """
    return torch.ops.specdec.decoder_stack_(
        hidden, cos, sin, kv_cache, int(write_start), write_index, int(kv_len), cache_lens,
        tree_mask, list(norms), list(linears), int(num_heads), int(num_kv_heads), float(scale),
        float(eps), [int(c) for c in capture],
    )
