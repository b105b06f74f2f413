"""Running an unmodified Hugging Face causal LM over blocks of new tokens.

A block is a chain (prefill, catch-up, drafting, chain verification) or a tree (tree
verification) of ``T`` tokens per request, placed right after that request's committed
prefix in a :class:`~specdec_kernels.decoding.cache.KVCache`. The model sees only public
inputs: ``input_ids``, ``position_ids`` (prefix length + depth), a 4D attention mask over
``[prefix + block]`` and the cache object.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch import Tensor

from specdec_kernels.decoding import step
from specdec_kernels.decoding.cache import KVCache
from specdec_kernels.decoding.cpu_matmul import SmallBatchLinear

__all__ = ["ModelRunner"]


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
    fast_cpu_linear : bool
        Run the model's small-batch float32 linears on CPU as ``W @ x^T`` (see
        :mod:`~specdec_kernels.decoding.cpu_matmul`); otherwise, on CPU, blocks of 2 or 3
        tokens are padded to 4, which MKL runs faster (measured here).
    """

    def __init__(self, model, *, fast_cpu_linear: bool = False):
        self.model = model
        self.fast_cpu_linear = fast_cpu_linear
        config = _text_config(model.config)
        self.config = config
        self.num_layers = int(config.num_hidden_layers)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        params = inspect.signature(model.forward).parameters
        self._has_logits_to_keep = "logits_to_keep" in params
        # Models set to the registered tree-attention kernel get tree metadata, not masks.
        self.uses_tree_kernel = getattr(config, "_attn_implementation", None) == step.ATTENTION_NAME
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty cache for ``batch`` requests of up to ``capacity`` rows each."""
        return KVCache(self.num_layers, batch, capacity, self.device)

    # ------------------------------------------------------------------ forwards

    def forward(
        self,
        cache: KVCache,
        tokens: Tensor,
        starts: list[int],
        parents: Tensor | None = None,
        *,
        last_logits_only: bool = False,
        exit_layer: int | None = None,
    ) -> Tensor:
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
        last_logits_only : bool
            Compute logits for the last block position only (prefill).
        exit_layer : int, optional
            Stop before decoder layer ``exit_layer`` and apply the final norm and the LM
            head to its input: the model's first ``exit_layer`` layers as a draft model
            (layer skip). Only layers ``< exit_layer`` write the cache.

        Returns
        -------
        Tensor
            ``[B, T, V]`` logits (``[B, 1, V]`` with ``last_logits_only``).
        """
        batch, width = tokens.shape
        padded = self._padded_width(width)
        if parents is None:
            parents = step.chain_parents(batch, padded, self.device)
        elif padded > width:
            parents = torch.nn.functional.pad(parents, (0, padded - width), value=-2)
        if padded > width:
            tokens = torch.nn.functional.pad(tokens, (0, padded - width))
        prefix_lens = torch.tensor(starts, dtype=torch.int64).to(self.device, non_blocking=True)
        cache.plan_write(starts, padded)
        kwargs = step.block_forward_kwargs(
            self.config, parents, prefix_lens, starts, self.dtype, self.uses_tree_kernel
        )
        kwargs.update(input_ids=tokens, past_key_values=cache, use_cache=True)
        with self._linear_mode():
            if exit_layer is not None:
                hidden = self._hidden_before(kwargs, exit_layer)
                hidden = hidden[:, width - 1 : width] if last_logits_only else hidden[:, :width]
                layers, norm, head = self.decoder_parts()
                return head(norm(hidden))
            if last_logits_only and self._has_logits_to_keep and padded == width:
                kwargs["logits_to_keep"] = 1
            logits = self.model(**kwargs).logits
        if last_logits_only:
            return logits[:, width - 1 : width].contiguous()
        return logits[:, :width].contiguous()  # a no-op unless the block was padded

    def _padded_width(self, width: int) -> int:
        # Measured on the 2-core CPU: MKL runs 2- and 3-row float32 GEMMs slower than 4-row
        # ones, so such blocks get padding nodes (never committed, never verified).
        if width in (2, 3) and self.device.type == "cpu" and not self.fast_cpu_linear:
            return 4
        return width

    def _linear_mode(self):
        if self.fast_cpu_linear and self.device.type == "cpu":
            return SmallBatchLinear()
        return contextlib.nullcontext()

    def append(self, cache: KVCache, token_lists: list, *, want_logits: bool = False):
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

        Returns
        -------
        Tensor or None
            ``[B, V]`` logits after each list's last token (rows of empty lists are
            meaningless) when ``want_logits``.
        """
        counts = [len(t) for t in token_lists]
        width = max(counts, default=0)
        if width == 0:
            return None
        block = torch.zeros(len(token_lists), width, dtype=torch.int64)
        for b, toks in enumerate(token_lists):
            block[b, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
        block = block.to(self.device, non_blocking=True)
        starts = list(cache.host_lens)
        uniform = min(counts) == width
        logits = self.forward(
            cache, block, starts, last_logits_only=not want_logits or uniform
        )
        cache.extend(counts)
        if not want_logits:
            return None
        if uniform:
            return logits[:, -1]
        last = torch.tensor([max(c - 1, 0) for c in counts]).to(self.device, non_blocking=True)
        return logits[torch.arange(len(counts), device=self.device), last]

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
        if not 1 <= exit_layer < len(layers):
            raise ValueError(f"exit_layer must be in [1, {len(layers) - 1}], got {exit_layer}")

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
