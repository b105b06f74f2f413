"""Running an unmodified Hugging Face causal LM over blocks of new tokens.

A block is a chain (prefill, catch-up, drafting, chain verification) or a tree (tree
verification) of ``T`` tokens per request, placed right after that request's committed
prefix in a :class:`~specdec_kernels.decoding.cache.KVCache`. The model sees only public
inputs: ``input_ids``, ``position_ids`` (prefix length + depth), a 4D attention mask over
``[prefix + block]`` (or the tree-attention metadata) and the cache object. With the package's
CPU kernels, a Llama-family model's forwards skip the module calls and run the same ops
directly (:class:`~specdec_kernels.models.direct_forward.DirectForward`, bit-identical).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec_kernels import ops
from specdec_kernels.decoding import calibration, kernel_choice
from specdec_kernels.decoding.cost import StepCost
from specdec_kernels.decoding.block import block_forward_kwargs, chain_parents
from specdec_kernels.decoding.cache import KVCache
from specdec_kernels.decoding.cpu_matmul import RoutedLinears, kernel_linear, takes_float_weight
from specdec_kernels.models.direct_forward import DirectForward, unsupported_reason
from specdec_kernels.models.hf_compat import cache_kwargs
from specdec_kernels.models.hf_tree_attention import (
    ATTENTION_NAME,
    METADATA_KWARG,
    register_tree_attention,
)

__all__ = ["FEATURE_KINDS", "PREFILL_CHUNK_TOKENS", "FeatureSpec", "ModelRunner",
           "observe_forwards"]

#: model -> callbacks told of each of its full forwards (see :func:`observe_forwards`).
_OBSERVERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _ObserverHandle:
    def __init__(self, model, callback):
        self._model, self._callback = weakref.ref(model), callback

    def remove(self) -> None:
        model = self._model()
        callbacks = _OBSERVERS.get(model, []) if model is not None else []
        if self._callback in callbacks:
            callbacks.remove(self._callback)


def observe_forwards(model, callback) -> _ObserverHandle:
    """Call ``callback(width, batch)`` after every full forward (not an early exit) that a
    :class:`ModelRunner` runs on ``model``, whichever path ran it (the model's own forward or
    the direct one, which skips module hooks). The benchmark counts target forwards this way.

    Returns
    -------
    handle
        ``handle.remove()`` stops the calls.
    """
    _OBSERVERS.setdefault(model, []).append(callback)
    return _ObserverHandle(model, callback)

#: Named capture points a drafter may ask for besides decoder-layer indices
#: (``Drafter.target_features``).
FEATURE_KINDS = ("final_norm",)

#: Which prefilled rows' features reach the drafter after the prefill.
PROMPT_ROWS = ("last", "all")


@dataclass(frozen=True)
class FeatureSpec:
    """Target features a drafter reads: hidden states at chosen points of the target's
    forward, concatenated along the last dimension in the order given.

    Attributes
    ----------
    layers : tuple of int or str
        Capture points: ``"final_norm"`` (the final norm's output, the LM head's input) or an
        int ``i``, the output of decoder layer ``i`` (0-based; negative counts from the end).
    prompt_rows : str
        ``"last"``: after the prefill the drafter gets the last prefilled row only (whose
        logits predict the pending token); ``"all"``: every prefilled row (a drafter with its
        own KV cache over the target's features prefills from them).
    """

    layers: tuple = ("final_norm",)
    prompt_rows: str = "last"

    @classmethod
    def of(cls, value) -> "FeatureSpec | None":
        """``None``, a :class:`FeatureSpec`, ``"final_norm"``, or a sequence of points."""
        if value is None or isinstance(value, FeatureSpec):
            return value
        if isinstance(value, (str, int)):
            value = (value,)
        if not isinstance(value, (tuple, list)) or not value:
            raise ValueError(
                f"target features must be a FeatureSpec or capture points, got {value!r}")
        return cls(tuple(value))

    def __post_init__(self):
        if not self.layers:
            raise ValueError("target features: give at least one capture point")
        bad = [p for p in self.layers
               if not (isinstance(p, int) and not isinstance(p, bool)) and p not in FEATURE_KINDS]
        if bad:
            raise ValueError(
                f"target features {bad!r} unknown; the engine provides decoder-layer indices "
                f"and {FEATURE_KINDS}"
            )
        if self.prompt_rows not in PROMPT_ROWS:
            raise ValueError(f"prompt_rows must be one of {PROMPT_ROWS}, got {self.prompt_rows!r}")

    def resolve(self, num_layers: int) -> tuple:
        """The capture points with layer indices made non-negative (checked)."""
        out = []
        for p in self.layers:
            if isinstance(p, int):
                if not -num_layers <= p < num_layers:
                    raise ValueError(
                        f"target features ask for decoder layer {p}; the target has "
                        f"{num_layers} layers"
                    )
                p = p % num_layers
            out.append(p)
        return tuple(out)

#: Prompts longer than this are prefilled in chunks of this many tokens: the block's masks
#: and attention grow with (chunk x prefix) instead of (prompt x prompt), and progress can be
#: reported. Longer than any prompt of the benchmark set (1.6k tokens), so those prefill in
#: one forward as before. Measured on the 2-core CPU, default model, fp32: 8190 tokens in
#: 31.9 s in chunks of 2048 vs 47.7 s in one forward; 4096 tokens in 12.1 s (11.1 s in
#: chunks of 1024) vs 15.2 s.
PREFILL_CHUNK_TOKENS = 2048


class _EarlyExit(Exception):
    """Raised by a pre-hook to stop a forward before a given decoder layer."""

    def __init__(self, hidden_states: Tensor):
        super().__init__()
        self.hidden_states = hidden_states


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


class ModelRunner:
    """Forwards of one causal LM against the engine's KV cache.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Any ``AutoModelForCausalLM`` with attention layers that call ``Cache.update`` (Llama,
        Qwen2, Mistral, Gemma3, ... families). Not modified.
    cpu_kernels : bool, optional
        On a CPU model, run the decoding and verification forwards through the package's
        batch-invariant kernels: linears through :func:`~specdec_kernels.ops.small_batch_linear`
        (see :mod:`~specdec_kernels.decoding.cpu_matmul`) and attention through the
        tree-attention kernel, so that verifying ``T`` tokens costs little more than one and
        yields exactly the logits of one-token decoding. Prefill forwards (:meth:`append`) send
        their large linears to torch's GEMM where it measures faster. Default (None): where
        the package's kernels measure faster than torch's on this machine
        (:mod:`~specdec_kernels.decoding.kernel_choice`; :attr:`kernels` says which path and
        why). From the first forward until :meth:`release`, the model's attention
        implementation is
        :data:`~specdec_kernels.models.hf_tree_attention.ATTENTION_NAME` (which behaves
        as sdpa in forwards without tree metadata); a model that cannot switch keeps the 4-D
        mask path.
    direct_forward : bool, optional
        With the CPU kernels, run a Llama-family model's forwards as plain tensor ops
        (:class:`~specdec_kernels.models.direct_forward.DirectForward`: the same ops as its
        modules, bit for bit, without their Python machinery) instead of calling the model.
        Default (None): wherever the model is supported (:attr:`direct_reason` says why not);
        False: always the model's own forward. Blocks whose linears all take the package's
        kernels run every layer in one :func:`~specdec_kernels.ops.decoder_stack_` call
        (:meth:`DirectForward.stacked
        <specdec_kernels.models.direct_forward.DirectForward.stacked>`, the same bits).
    """

    def __init__(self, model, *, cpu_kernels: bool | None = None,
                 direct_forward: bool | None = None):
        self.model = model
        self._direct_wanted = direct_forward
        self._direct = None  # the DirectForward, built on first use (False: not supported)
        self.direct_reason = None if direct_forward is not False else "switched off"
        first = next(model.parameters())
        self._requested = cpu_kernels
        self._kernels = None
        self._previous_attention = None
        config = _text_config(model.config)
        self.config = config
        self.num_layers = int(config.num_hidden_layers)
        head = model.get_output_embeddings()
        # out_features first: a quantized LM head's ``weight`` is a method, not a tensor.
        self.vocab_size = int(getattr(head, "out_features", None) or head.weight.shape[0])
        params = inspect.signature(model.forward).parameters
        self._has_logits_to_keep = "logits_to_keep" in params
        # Models set to the registered tree-attention kernel get tree metadata, not masks.
        self.uses_tree_kernel = getattr(config, "_attn_implementation", None) == ATTENTION_NAME
        self.device, self.dtype = first.device, first.dtype
        self._step_cost = None
        self._routed = None  # the model's linears on the package's kernels, found on first use

    @property
    def kernels(self) -> kernel_choice.KernelChoice:
        """Which kernels the forwards use (decided on first use, see
        :func:`~specdec_kernels.decoding.kernel_choice.choose`)."""
        if self._kernels is None:
            self._kernels = kernel_choice.choose(self.model, self._requested)
        return self._kernels

    @property
    def cpu_kernels(self) -> bool:
        """Whether the decoding and verification forwards run the package's CPU kernels."""
        return self.kernels.package

    @cpu_kernels.setter
    def cpu_kernels(self, value: bool) -> None:
        self._requested = bool(value)
        self._kernels = None

    def _use_cpu_kernels(self) -> bool:
        """Whether this forward runs the CPU kernels (switching the attention on first use)."""
        if not self.cpu_kernels or self.device.type != "cpu":
            return False
        if not self.uses_tree_kernel and self._previous_attention is None:
            self._previous_attention = self.config._attn_implementation
            register_tree_attention()
            self.model.set_attn_implementation(ATTENTION_NAME)
            self.uses_tree_kernel = self.config._attn_implementation == ATTENTION_NAME
        return True

    def _direct_available(self) -> DirectForward | None:
        """The model's :class:`DirectForward` (built on first use), or None where it is
        switched off or the model is not supported."""
        if self._direct_wanted is False:
            return None
        if self._direct is None:
            self.direct_reason = unsupported_reason(self.model)
            if self.direct_reason is not None and self._direct_wanted:
                raise ValueError(f"direct_forward=True: {self.direct_reason}")
            self._direct = False if self.direct_reason else DirectForward(self.model)
        return self._direct or None

    @property
    def forward_path(self) -> str:
        """``"direct"`` when the decoding forwards run :class:`DirectForward`, ``"model"`` when
        they call the model (part of what the step-cost curve is measured for)."""
        direct = self.cpu_kernels and self.device.type == "cpu" and self._direct_available()
        return "direct" if direct else "model"

    def _direct_for(self, cpu_kernels: bool, kv_len: int) -> DirectForward | None:
        """The direct forward when this forward can take it: the package's CPU kernels and
        tree attention in use, a supported model, no sliding window cutting ``kv_len`` rows,
        no forward hooks on its modules (the direct forward would skip them)."""
        if not (cpu_kernels and self.uses_tree_kernel):
            return None
        direct = self._direct_available()
        if direct is None or not direct.covers(kv_len) or direct.hooked():
            return None
        return direct

    def linears(self, module: torch.nn.Module):
        """A factory of contexts in which ``module``, a drafter's own network (EAGLE's draft
        layer, say), runs its CPU linears on the same kernels as this runner's forwards: the
        package's small-batch kernel where the kernel choice picked it (row counts of a
        prefill left to torch's GEMM), else torch's. Call it once (:meth:`Drafter.bind`), enter
        ``factory()`` around each use. torch's GEMM packs the weight on every call of 2 to 32
        rows, which made the EAGLE draft layer's 21 linears a step cost 7.5 ms on the default
        model (2026-11-26)."""
        if self.device.type != "cpu" or not self.cpu_kernels:
            return contextlib.nullcontext
        return functools.partial(RoutedLinears(module), self.kernels.prefill_gemm_rows)

    def step_cost(self, curve=None) -> StepCost:
        """``c(T)``, the cost of one forward over ``T`` tokens per request, for sizing drafts
        and trees: ``curve`` when given (see :meth:`StepCost.load
        <specdec_kernels.decoding.cost.StepCost.load>`), else this machine's for this model
        (:func:`~specdec_kernels.decoding.calibration.machine_step_cost`: measured on first
        use, then cached per machine and model)."""
        if curve is not None:
            return StepCost.load(curve)
        if self._step_cost is None:
            self._step_cost = calibration.machine_step_cost(self)
        return self._step_cost

    def release(self) -> None:
        """Give the model back its own attention implementation (if this runner switched it)."""
        if self._previous_attention is not None:
            self.model.set_attn_implementation(self._previous_attention)
            self._previous_attention = None
            self.uses_tree_kernel = False

    def new_cache(self, batch: int, capacity: int, kv_dtype: torch.dtype | None = None) -> KVCache:
        """An empty cache for ``batch`` requests of up to ``capacity`` rows each, its K/V in
        ``kv_dtype`` (default the model's; see :meth:`narrow_kv_dtype`).

        Raises
        ------
        ValueError
            A ``kv_dtype`` these forwards cannot read.
        """
        narrow = self.narrow_kv_dtype()
        if kv_dtype not in (None, self.dtype, narrow):
            raise ValueError(
                f"kv_dtype={kv_dtype}: this runner's forwards read K/V in {self.dtype}"
                + (f" or {narrow}" if narrow else "")
                + " (a narrower cache needs a float32 model on the package's CPU kernels)"
            )
        if self._direct:  # a new generation: weights swapped in place since are seen
            self._direct.refresh()
        return KVCache(self.num_layers, batch, capacity, self.device, dtype=kv_dtype)

    def narrow_kv_dtype(self) -> torch.dtype | None:
        """The narrower K/V dtype these forwards can read, or None: bfloat16 for a float32
        model whose forwards run the package's CPU kernels (their tree attention widens a
        bfloat16 cache exactly; every other attention needs K/V in the model's dtype). A
        drafter's own cache in it halves the bytes its attention reads, at the cost of K/V
        rounded to bfloat16: draft quality, never the output (the target's cache stays)."""
        if self.dtype == torch.float32 and self.device.type == "cpu" and self.cpu_kernels:
            return torch.bfloat16
        return None

    # ------------------------------------------------------------------ forwards

    def forward(
        self,
        cache: KVCache,
        tokens: Tensor,
        starts: list[int],
        parents: Tensor | None = None,
        *,
        extra=None,
        last_logits_only: bool = False,
        exit_layer: int | None = None,
        features: "FeatureSpec | bool" = False,
        prefill: bool = False,
    ):
        """Run a block of ``T`` tokens per request placed after each request's prefix.

        Parameters
        ----------
        cache : KVCache
            Receives the block's K/V at rows ``starts[b] .. starts[b] + T - 1``.
        tokens : Tensor
            ``[B, T]`` int64 token ids on the model's device.
        starts : list of int
            ``B`` prefix lengths (rows ``< starts[b]`` are the visible prefix).
        parents : Tensor, optional
            ``[B, T]`` tree parents (node 0 the root, ``-2`` padding); a chain when omitted.
        extra : ExtraRows, optional
            The last ``R`` columns of ``tokens`` are rows outside the tree/chain (which is then
            ``T - R`` wide), with their own positions and masks
            (:class:`~specdec_kernels.decoding.drafter.ExtraRows`).
        last_logits_only : bool
            Compute logits for the last block position only (prefill).
        exit_layer : int, optional
            Stop before decoder layer ``exit_layer`` and apply the final norm and the LM
            head to its input: the model's first ``exit_layer`` layers as a draft model
            (layer skip). Only layers ``< exit_layer`` write the cache.
        features : FeatureSpec or bool
            Also return the target features of every block row (``True``: the final norm's
            output, the LM head's input), read by forward hooks on the capture points during
            this forward only (not with ``exit_layer``).
        prefill : bool
            The block is known tokens (a prompt, a draft model catching up), not a draft to
            verify: its rows need not be batch-invariant, so with the package's kernels its
            linears of at least :attr:`KernelChoice.prefill_gemm_rows
            <specdec_kernels.decoding.kernel_choice.KernelChoice.prefill_gemm_rows>` rows run
            torch's GEMM.

        Returns
        -------
        Tensor or (Tensor, Tensor)
            ``[B, T, V]`` logits (``[B, 1, V]`` with ``last_logits_only``); with ``features``
            also ``[B, T, P * H]`` hidden states of every block row at the ``P`` capture
            points, concatenated.
        """
        batch, width = tokens.shape
        cpu_kernels = self._use_cpu_kernels()
        rows = 0 if extra is None else extra.num_rows  # extra rows follow the chain/tree
        if parents is None:
            parents = chain_parents(batch, width - rows, self.device)
        prefix_lens = torch.tensor(starts, dtype=torch.int64).to(self.device, non_blocking=True)
        cache.plan_write(starts, width)
        kwargs = block_forward_kwargs(
            self.config, parents, prefix_lens, starts, self.dtype, self.uses_tree_kernel, extra
        )
        kwargs.update(input_ids=tokens, use_cache=True)
        kwargs.update(cache_kwargs(self.model, cache))
        if features and exit_layer is not None:
            raise ValueError("features are the full model's: not available with exit_layer")
        if exit_layer is not None and not 1 <= exit_layer < self.num_layers:
            raise ValueError(f"exit_layer must be in [1, {self.num_layers - 1}], got {exit_layer}")
        spec = FeatureSpec() if features is True else (features or None)
        gemm_rows = self.kernels.prefill_gemm_rows if prefill else None
        if exit_layer is None:
            for callback in _OBSERVERS.get(self.model, ()):
                callback(width, batch)
        direct = self._direct_for(cpu_kernels, max(starts) + width)
        if direct is not None:
            return self._forward_direct(direct, cache, kwargs, spec, exit_layer,
                                        last_logits_only, gemm_rows)
        captured = {}
        hook = self._capture(spec, captured) if spec else contextlib.nullcontext()
        if cpu_kernels and self._routed is None:
            self._routed = RoutedLinears(self.model)
        linear = self._routed(gemm_rows) if cpu_kernels else contextlib.nullcontext()
        with linear, hook:
            if exit_layer is not None:
                hidden = self._hidden_before(kwargs, exit_layer)
                hidden = hidden[:, width - 1 : width] if last_logits_only else hidden[:, :width]
                layers, norm, head = self.decoder_parts()
                return head(norm(hidden))
            if last_logits_only and self._has_logits_to_keep:
                kwargs["logits_to_keep"] = 1
            logits = self.model(**kwargs).logits
        if last_logits_only:
            logits = logits[:, -1:].contiguous()
        if spec:
            return logits, captured["hidden"]
        return logits

    def _forward_direct(self, direct: DirectForward, cache: KVCache, kwargs: dict, spec,
                        exit_layer, last_logits_only: bool, gemm_rows):
        """:meth:`forward` through :class:`DirectForward`: the same K/V writes, tree attention
        and linears as the model's own forward with the registered attention."""
        meta = kwargs[METADATA_KWARG]

        def attend(layer, q, k, v, scale):
            keys, values = cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
            return ops.tree_attention(q, keys, values, meta.cache_lens, meta.packed_mask, scale)

        max_rows = None if gemm_rows is None else gemm_rows - 1
        points = spec.resolve(self.num_layers) if spec else ()
        linear = functools.partial(kernel_linear, max_rows=max_rows)
        tokens = kwargs["input_ids"]
        # Every layer in one op where all the block's linears take the package's kernels.
        if cache.buffer is not None and (max_rows is None or tokens.numel() <= max_rows):
            block = dict(cache.planned_block(), cache_lens=meta.cache_lens,
                         tree_mask=meta.packed_mask)
            result = direct.stacked(tokens, kwargs["position_ids"], block, takes_float_weight,
                                    head_linear=linear, stop_before=exit_layer, capture=points,
                                    last_only=last_logits_only)
            if result is not None:
                logits, outputs = result
                return (logits, _joined(points, outputs)) if spec else logits
        logits, outputs = direct(tokens, kwargs["position_ids"], attend, linear=linear,
                                 stop_before=exit_layer, capture=points,
                                 last_only=last_logits_only)
        if spec:
            return logits, _joined(points, outputs)
        return logits

    @contextlib.contextmanager
    def _capture(self, spec: FeatureSpec, captured: dict):
        """Record the outputs of the capture points of ``spec`` during the forward run inside
        the block, concatenated into ``captured["hidden"]``."""
        layers, norm, _ = self.decoder_parts()
        points = spec.resolve(len(layers))
        outputs: dict = {}
        handles = []
        for point in dict.fromkeys(points):
            module = norm if point == "final_norm" else layers[point]

            def record(module, args, output, point=point):
                outputs[point] = output[0] if isinstance(output, tuple) else output

            handles.append(module.register_forward_hook(record))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        captured["hidden"] = _joined(points, outputs)

    def feature_width(self, spec: "FeatureSpec | bool") -> int:
        """Width of the features ``spec`` captures (``P * hidden_size``)."""
        spec = FeatureSpec() if spec is True else spec
        return len(spec.layers) * int(self.config.hidden_size)

    def append(
        self, cache: KVCache, token_lists: list, *, want_logits: bool = False,
        want_features: "FeatureSpec | bool" = False,
    ):
        """Run ragged lists of known tokens after each request's prefix and commit them.

        Used for prefill and for a draft model catching up with emitted tokens. Lists are
        right-padded into one block; the padding's rows are written but never committed.

        Parameters
        ----------
        cache : KVCache
        token_lists : list of list of int
            ``B`` lists (some may be empty).
        want_logits : bool
            Return the logits after each request's last token.
        want_features : bool
            Also return the final-norm hidden state of each list's last token (zeros for
            empty lists), see :meth:`forward`.

        Returns
        -------
        Tensor or None
            ``[B, V]`` logits after each list's last token (rows of empty lists are
            meaningless) when ``want_logits``.
        Tensor
            With ``want_features``: ``(logits_or_None, [B, H] features)``.
        """
        counts = [len(t) for t in token_lists]
        width = max(counts, default=0)
        spec = FeatureSpec() if want_features is True else (want_features or None)
        all_rows = spec is not None and spec.prompt_rows == "all"
        if width == 0:
            if spec is not None:
                shape = (len(token_lists), 0) if all_rows else (len(token_lists),)
                return None, torch.zeros(
                    *shape, self.feature_width(spec), dtype=self.dtype, device=self.device
                )
            return None
        block = torch.zeros(len(token_lists), width, dtype=torch.int64)
        for b, toks in enumerate(token_lists):
            block[b, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
        block = block.to(self.device, non_blocking=True)
        starts = list(cache.host_lens)
        uniform = min(counts) == width
        out = self.forward(
            cache, block, starts, last_logits_only=not want_logits or uniform,
            features=spec or False, prefill=True,
        )
        logits, hidden = out if spec is not None else (out, None)
        cache.extend(counts)
        last = torch.tensor([max(c - 1, 0) for c in counts]).to(self.device, non_blocking=True)
        rows = torch.arange(len(counts), device=self.device)
        if hidden is not None and not all_rows:
            hidden = hidden[rows, last]
            if min(counts) == 0:  # nothing was run for empty lists
                ran = torch.tensor([c > 0 for c in counts]).to(self.device, non_blocking=True)
                hidden = hidden * ran[:, None].to(hidden.dtype)
        if want_logits:
            logits = logits[:, -1] if uniform else logits[rows, last]
        else:
            logits = None
        return (logits, hidden) if spec is not None else logits

    def prefill(
        self, cache: KVCache, token_lists: list, *, chunk_size: int | None = None, progress=None,
        want_features: "FeatureSpec | bool" = False,
    ):
        """:meth:`append` ragged lists of prompt tokens in chunks of at most ``chunk_size``
        tokens per request (one forward when every list fits in one chunk).

        Parameters
        ----------
        cache : KVCache
        token_lists : list of list of int
            ``B`` lists (some may be empty).
        chunk_size : int, optional
            Tokens per request and forward; :data:`PREFILL_CHUNK_TOKENS` by default.
        progress : callable, optional
            ``progress(done, total)`` in tokens of all requests: called before the first
            chunk and after each one, when there are several.
        want_features : FeatureSpec or bool
            Return the target features of each list's last token (zeros for empty lists), or
            of all its rows (``prompt_rows == "all"``), see :meth:`append`.

        Returns
        -------
        Tensor or None
            ``[B, W]`` (last rows) or ``[B, max(len), W]`` (all rows) features with
            ``want_features``, else ``None``.
        """
        chunk = PREFILL_CHUNK_TOKENS if chunk_size is None else chunk_size
        if chunk < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk}")
        longest = max((len(t) for t in token_lists), default=0)
        if longest <= chunk:
            out = self.append(cache, token_lists, want_features=want_features)
            return out[1] if want_features else None
        total, done, features = sum(len(t) for t in token_lists), 0, None
        all_rows = isinstance(want_features, FeatureSpec) and want_features.prompt_rows == "all"
        if progress is not None:
            progress(0, total)
        pieces = []
        for begin in range(0, longest, chunk):
            part = [t[begin : begin + chunk] for t in token_lists]
            out = self.append(cache, part, want_features=want_features)
            if all_rows:
                pieces.append(out[1])
            elif want_features:  # a list's last token sits in the last chunk it reaches
                ran = torch.tensor([len(t) > 0 for t in part], device=self.device)
                features = (out[1] if features is None
                            else torch.where(ran[:, None], out[1], features))
            done += sum(len(t) for t in part)
            if progress is not None:
                progress(done, total)
        if all_rows:
            features = torch.cat(pieces, 1)
        return features

    def decoder_parts(self):
        """``(layers, final_norm, lm_head)`` of the model, found through public accessors.

        Raises
        ------
        ValueError
            The model's decoder does not expose ``layers`` and ``norm`` modules.
        """
        decoder = self.model.get_decoder()
        layers = getattr(decoder, "layers", None)
        norm = getattr(decoder, "norm", None)
        head = self.model.get_output_embeddings()
        if layers is None or norm is None or head is None:
            raise ValueError(
                f"layer skip needs a decoder with `layers` and `norm` and an LM head; "
                f"{type(self.model).__name__} does not expose them"
            )
        return layers, norm, head

    def _hidden_before(self, kwargs, exit_layer: int) -> Tensor:
        """Hidden states entering decoder layer ``exit_layer`` (the forward stops there)."""
        layers, _, _ = self.decoder_parts()

        def stop(module, args, hook_kwargs):
            hidden = args[0] if args else hook_kwargs["hidden_states"]
            raise _EarlyExit(hidden)

        handle = layers[exit_layer].register_forward_pre_hook(stop, with_kwargs=True)
        try:
            self.model(**kwargs)
        except _EarlyExit as exit_:
            return exit_.hidden_states
        finally:
            handle.remove()
        raise RuntimeError("the early-exit hook did not fire")  # pragma: no cover


def _joined(points: tuple, outputs: dict) -> Tensor:
    """The outputs of the capture points, concatenated along the last dimension in order."""
    missing = [p for p in points if p not in outputs]
    if missing:
        raise RuntimeError(f"capture points {missing} did not run in the target's forward")
    parts = [outputs[p] for p in points]
    return parts[0] if len(parts) == 1 else torch.cat(parts, -1)
