"""The target as its own prophet, compressed: a copy of the target whose linear layers are
int8 weight-quantized (torch's dynamic quantization: int8 weights per output channel,
activations quantized on the fly) drafts ``K`` tokens with its own cache, exactly like a
separate draft model (:class:`~specdec_kernels.decoding.draft_model.DraftModelDrafter`). No
training, and it agrees with the target far more often than a smaller model would.

Torch's dynamic int8 kernels (fbgemm / onednn) run on CPU only: a target on another device is
refused with a ``ValueError``.
"""

from __future__ import annotations

import copy
import warnings
import weakref

import torch

from specdec_kernels.decoding.draft_model import DraftModelDrafter
from specdec_kernels.decoding.runner import ModelRunner

__all__ = ["QuantizedSelfDrafter", "quantize_int8"]

# One quantized copy per target model object (quantizing takes seconds; runs reuse it).
_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def quantize_int8(model):
    """A copy of ``model`` with every ``nn.Linear`` dynamically quantized to int8 (per output
    channel), the rest (embeddings, norms) unchanged; ``model`` itself is untouched.

    Raises
    ------
    ValueError
        ``model`` is not a float32 model on the CPU.
    """
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32:
        raise ValueError(
            f"model: int8 dynamic quantization needs a float32 model on the CPU, got "
            f"{first.dtype} on {first.device}"
        )
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    clone = copy.deepcopy(model)
    # Tied LM head and embedding: the quantized LM head gets its own int8 copy.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates its quantized tensor creation
        quantized = quantize_dynamic(
            clone, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
        )
    return quantized.eval()


class QuantizedSelfDrafter(DraftModelDrafter):
    """Drafts with an int8 copy of the target.

    Parameters
    ----------
    num_draft : int
        Drafts per step ``K`` (the start value when ``adaptive``).
    adaptive, min_draft, max_draft, confidence_threshold
        See :class:`~specdec_kernels.decoding.chain_drafter.AutoregressiveDrafter`.
    """

    name = "quantized-self"

    def __init__(self, *, num_draft: int = 3, **kwargs):
        # The draft model is the target's copy, made when the target is known (bind).
        super(DraftModelDrafter, self).__init__(num_draft, **kwargs)
        self.model = None
        self.tokenizer = None
        self.runner = None
        self.cache = None

    def bind(self, runner: ModelRunner, tokenizer) -> None:
        target = runner.model
        if runner.device.type != "cpu":
            raise ValueError(
                f"quantized-self: torch's int8 dynamic quantization runs on the CPU; the "
                f"target is on {runner.device}"
            )
        model = _COPIES.get(target)
        if model is None:
            model = quantize_int8(target)
            _COPIES[target] = model
        self.model = model
        self.runner = ModelRunner(model)
        super().bind(runner, tokenizer)

    def max_block_width(self) -> int:
        return (self.max_draft if self.adaptive else self.num_draft) + 1

    def describe(self) -> dict:
        out = super().describe() if self.model is not None else {"name": self.name}
        out["model"] = "int8 dynamic quantization of the target (torch.ao, per channel)"
        return out
