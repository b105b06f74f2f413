"""Self-speculative decoding by layer skip: the target's own first ``L`` decoder layers, then
its final norm and LM head, draft ``K`` tokens. No extra weights and no extra cache: the
draft's K/V for layers ``< L`` are exactly what the target computes there, so drafts write
into the target's own cache rows past the prefix, which verification then overwrites.

The draft's logits are the final norm and LM head applied to the hidden state entering layer
``L`` (model-specific logit post-processing, such as Gemma's soft-capping, is skipped: it
only shapes the proposal, never the output)."""

from __future__ import annotations

from torch import Tensor

from specdec_kernels.decoding import calibration
from specdec_kernels.decoding.chain_drafter import AutoregressiveDrafter
from specdec_kernels.decoding.drafter import DecodeState

__all__ = ["DEFAULT_LAYERS_SKIPPED", "SelfSpeculativeDrafter"]

#: Without ``num_layers``, the draft skips this many of the target's last layers. Measured on
#: the default model (SmolLM2-135M, 30 layers, not trained for early exit): first-draft
#: acceptance is 7% with 6 layers, 13% with 18, 30% with 22, 41% with 26 and 54% with 28,
#: while the draft costs about (L/30 of the layers + the LM head); the best trade-off was 28
#: layers with one draft per step.
DEFAULT_LAYERS_SKIPPED = 2


class SelfSpeculativeDrafter(AutoregressiveDrafter):
    """Drafts with the target's first ``num_layers`` layers (early exit).

    Parameters
    ----------
    num_layers : int, optional
        Layers used by the draft, in ``[1, num_hidden_layers - 1]``; by default all but the
        last ``DEFAULT_LAYERS_SKIPPED``.
    num_draft, adaptive, min_draft, max_draft, confidence_threshold, budget, cost_curve, draft_cost_curve
        See :class:`~specdec_kernels.decoding.chain_drafter.AutoregressiveDrafter`.
    """

    name = "self-speculative"

    def __init__(self, num_layers: int | None = None, *, num_draft: int = 1, **kwargs):
        super().__init__(num_draft, **kwargs)
        # The upper limit is the target's layer count, checked by bind (before any allocation).
        if num_layers is not None and (not isinstance(num_layers, int) or num_layers < 1):
            raise ValueError(f"num_layers must be an integer >= 1, got {num_layers!r}")
        self.num_layers = num_layers
        self._exit = None
        self._runner = None

    def bind(self, runner, tokenizer) -> None:
        super().bind(runner, tokenizer)
        total = runner.num_layers
        exit_layer = self.num_layers
        if exit_layer is None:
            exit_layer = max(1, total - DEFAULT_LAYERS_SKIPPED)
        if not 1 <= exit_layer < total:
            raise ValueError(
                f"num_layers must be in [1, {total - 1}] for a target of {total} layers, "
                f"got {exit_layer} (the draft runs the target's first layers; all {total} "
                "would be the target itself, at the same cost)"
            )
        runner.decoder_parts()  # fails early on models without the needed modules
        self._exit = exit_layer
        self._runner = runner

    def describe(self) -> dict:
        out = super().describe()
        out["num_layers"] = self._exit if self._exit is not None else self.num_layers
        return out

    def _draft_cost(self, runner) -> dict | None:
        return calibration.machine_draft_cost(runner, runner, self._exit)

    def _first_logits(self, state: DecodeState) -> Tensor:
        return self._draft_forward(state, state.pending, 0)

    def _next_logits(self, state: DecodeState, tokens: Tensor, depth: int) -> Tensor:
        return self._draft_forward(state, tokens, depth)

    def _draft_forward(self, state: DecodeState, tokens: Tensor, depth: int) -> Tensor:
        starts = [n + depth for n in state.cache.host_lens]
        logits = self._runner.forward(state.cache, tokens[:, None], starts, exit_layer=self._exit)
        return logits[:, -1]
