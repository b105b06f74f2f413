"""The engine's preallocated KV cache, plugged into Hugging Face models through the public
``transformers.cache_utils.Cache`` API.

One stacked buffer ``[L, 2, B, H, S, D]`` holds every layer's K and V. Each request ``b`` has
its own committed length ``lens[b]``; a forward writes its ``T`` new rows at
``starts[b] .. starts[b] + T - 1`` (the speculative region) and attends over the first
``max(starts) + T`` rows under the engine's 4D mask. After verification,
:func:`specdec_kernels.ops.compact_kv_cache_` moves the accepted rows into place for all
layers in one launch and advances ``lens``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from specdec_kernels import ops

__all__ = ["KVCache"]


class _KVCacheLayer(CacheLayerMixin):
    """One layer's view of a :class:`KVCache`; all the work is done by the owner."""

    is_compileable = False
    is_sliding = False
    supports_early_init = False

    def __init__(self, owner: "KVCache", layer_idx: int):
        super().__init__()
        self._owner = owner
        self._layer_idx = layer_idx

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self._owner._allocate(key_states)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        self.is_initialized = True
        return self._owner.write(self._layer_idx, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.kv_len, 0

    def get_seq_length(self) -> int:
        return max(self._owner.host_lens, default=0)

    def get_max_length(self) -> int:
        return self._owner.capacity

    # Its name before transformers 5.16 (abstract there).
    get_max_cache_shape = get_max_length


class KVCache(Cache):
    """Preallocated per-request KV cache for ``num_layers`` attention layers.

    Allocated lazily on the first write (so K/V head counts, head size, dtype and device come
    from the model itself), then never reallocated except by :meth:`select_requests`.

    Parameters
    ----------
    num_layers : int
        Number of decoder layers of the model.
    batch : int
        Number of requests.
    capacity : int
        Rows per request ``S``: prompt + new tokens + the largest speculative block.
    device : torch.device
        Device of the length tensors (the buffer follows the model's K/V).
    dtype : torch.dtype, optional
        The buffer's dtype; by default the model's K/V dtype. A narrower one (bfloat16 under a
        float32 model) halves the bytes attention reads; the K/V are rounded to it as they are
        written. Only the package's CPU tree attention reads such a cache
        (:meth:`ModelRunner.new_cache <specdec_kernels.decoding.runner.ModelRunner.new_cache>`
        checks).

    Attributes
    ----------
    buffer : Tensor or None
        ``[L, 2, B, H, S, D]`` K and V of every layer.
    lens : Tensor
        ``[B]`` int64 committed length per request, on ``device`` (advanced by the KV op).
    host_lens : list of int
        The same lengths on the host (the engine updates both; no device read needed).
    """

    def __init__(self, num_layers: int, batch: int, capacity: int, device: torch.device,
                 dtype: torch.dtype | None = None):
        super().__init__(layers=[_KVCacheLayer(self, i) for i in range(num_layers)])
        self.num_layers = num_layers
        self.batch = batch
        self.capacity = capacity
        self.device = torch.device(device)
        self.dtype = dtype
        self.buffer: Tensor | None = None
        self.lens = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.host_lens = [0] * batch
        self.kv_len = 0
        self._start: int | None = None
        self._width = 0
        self._write_index: Tensor | None = None

    # ------------------------------------------------------------------ forward-time writes

    def plan_write(self, starts: list[int], width: int) -> None:
        """Declare where the next forward's ``width`` rows go: ``starts[b] + [0, width)``.

        Raises
        ------
        ValueError
            A block would run past the capacity.
        """
        if len(starts) != self.batch:
            raise ValueError(f"plan_write: {len(starts)} starts for a batch of {self.batch}")
        end = max(starts) + width
        if end > self.capacity:
            raise ValueError(
                f"KV cache overflow: rows up to {end} needed, capacity is {self.capacity}"
            )
        self.kv_len = end
        self._width = width
        if min(starts) == max(starts):
            self._start, self._write_index = starts[0], None
        else:
            self._start = None
            rows = torch.tensor(starts, dtype=torch.int64).unsqueeze(1) + torch.arange(width)
            self._write_index = rows.to(self.device, non_blocking=True)

    def planned_block(self) -> dict:
        """Where the forward declared by :meth:`plan_write` writes its rows, as
        :func:`~specdec_kernels.ops.decoder_stack_` takes it: ``kv_cache`` (the buffer, which
        must exist: a first forward goes through :meth:`write`), ``write_start`` and
        ``write_index`` (None when every request's block starts at ``write_start``, else the
        ``[B, T]`` rows) and ``kv_len``."""
        if self.buffer is None:
            raise ValueError("planned_block: the cache has no buffer before its first write")
        start = 0 if self._start is None else self._start
        return dict(kv_cache=self.buffer, write_start=start, write_index=self._write_index,
                    kv_len=self.kv_len)

    def _allocate(self, key_states: Tensor) -> None:
        batch, heads, _, head_dim = key_states.shape
        if batch != self.batch:
            raise ValueError(f"KVCache was made for batch {self.batch}, the model wrote {batch}")
        shape = (self.num_layers, 2, batch, heads, self.capacity, head_dim)
        dtype = self.dtype or key_states.dtype
        self.buffer = torch.zeros(shape, dtype=dtype, device=key_states.device)

    def write(self, layer_idx: int, key_states: Tensor, value_states: Tensor):
        """Store one layer's K/V of the block declared by :meth:`plan_write` (allocating the
        buffer on the first write).

        Parameters
        ----------
        layer_idx : int
        key_states, value_states : Tensor
            ``[B, H, T, D]``.

        Returns
        -------
        tuple of Tensor
            The layer's K and V ``[B, H, max(starts) + T, D]`` (views of the buffer).
        """
        if self.buffer is None:
            self._allocate(key_states)
        keys, values = self.buffer[layer_idx, 0], self.buffer[layer_idx, 1]
        if key_states.shape != value_states.shape or key_states.shape[1::2] != keys.shape[1::2]:
            raise ValueError(
                f"layer {layer_idx} wrote K {tuple(key_states.shape)} / V "
                f"{tuple(value_states.shape)}; the cache holds [B, H, S, D] = {tuple(keys.shape)}"
            )
        if self._start is not None:
            rows = slice(self._start, self._start + self._width)
            keys[:, :, rows].copy_(key_states)
            values[:, :, rows].copy_(value_states)
        else:
            index = self._write_index.view(self.batch, 1, self._width, 1).expand_as(key_states)
            keys.scatter_(2, index, key_states.to(keys.dtype))
            values.scatter_(2, index, value_states.to(values.dtype))
        return keys[:, :, : self.kv_len], values[:, :, : self.kv_len]

    # ------------------------------------------------------------------ commits

    def compact(self, accept_positions: Tensor, num_accepted: Tensor) -> None:
        """Keep the accepted rows of the last forward(s) and advance ``lens`` (device only).

        Parameters
        ----------
        accept_positions : Tensor
            ``[B, P]`` absolute rows to keep per request, in order, ``-1`` padded.
        num_accepted : Tensor
            ``[B]`` valid columns per request.

        Call :meth:`advance_host` with the same counts once they are known on the host.
        """
        if self.buffer is not None:
            ops.compact_kv_cache_(self.buffer, self.lens, accept_positions, num_accepted)
        else:
            self.lens += num_accepted

    def extend(self, counts: list[int]) -> None:
        """Commit rows written right after each prefix, where they already are."""
        self.lens += torch.tensor(counts, dtype=torch.int64).to(self.device, non_blocking=True)
        self.advance_host(counts)

    def advance_host(self, counts: list[int]) -> None:
        """Advance the host copy of the lengths (after :meth:`compact`)."""
        self.host_lens = [n + c for n, c in zip(self.host_lens, counts)]

    def select_requests(self, keep: list[int]) -> None:
        """Drop every request not in ``keep`` (a copy of the kept rows)."""
        index = torch.tensor(keep, dtype=torch.int64, device=self.device)
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(2, index.to(self.buffer.device))
        self.lens = self.lens.index_select(0, index)
        self.host_lens = [self.host_lens[i] for i in keep]
        self.batch = len(keep)
        self._start, self._write_index = None, None

    def layer_kv(self, layer_idx: int) -> tuple[Tensor, Tensor]:
        """K and V ``[B, H, S, D]`` of one layer (views of the buffer)."""
        return self.buffer[layer_idx, 0], self.buffer[layer_idx, 1]
