"""The decoding loop: prefill, then one shared step until every request stops.

Each step: the drafter proposes (a chain or a tree) -> the target runs the whole block in one
forward -> the proposal's acceptance rule decides (one verification op) -> the KV op commits
the accepted path -> tokens are emitted. Methods differ only in the drafter. The step reads
the device once, to learn what was accepted.

Callers can watch a run through one callback, ``on_emit(request, tokens, finished)`` (see
:meth:`Engine.start`): it receives each request's new tokens after every step, already cut at
its stop condition, so the concatenation of what it receives is exactly the request's output
(streaming).

Before the first step the target has seen each prompt but its last token, which becomes the
request's *pending* token (emitted, K/V not yet cached): the first step verifies drafts too.

A drafter that asks for target features (``Drafter.target_features``: the final norm, or
chosen decoder layers) gets those hidden states of the accepted rows out of the same forward,
gathered on the device (see :mod:`~specdec_kernels.decoding.drafter`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from specdec_kernels import ops
from specdec_kernels.decoding import machine_cache
from specdec_kernels.decoding.acceptance import Verdict
from specdec_kernels.decoding.drafter import (
    BLOCK_LIMIT_REASON,
    MAX_BLOCK_WIDTH,
    DecodeState,
    Drafter,
    NoDrafter,
    Proposal,
    StepOutcome,
)
from specdec_kernels.decoding.runner import FeatureSpec, ModelRunner
from specdec_kernels.decoding.stats import RequestStats, RunStats
from specdec_kernels.sampling import SamplingParams
from specdec_kernels.tree import PAD_PARENT

__all__ = ["Engine", "EngineOutput", "Generation", "StopCriteria"]

_DRAFT_SEED_SALT = 0x5DEECE66D  # draft samples use a stream independent of verification's


@dataclass
class Generation:
    """A run in progress: the drafters' shared state plus outputs and statistics.

    ``rows[b]`` is the request index of running row ``b`` of ``state``; finished requests
    are dropped from ``state`` (and from the caches).
    """

    state: DecodeState
    stop: "StopCriteria"
    stats: RunStats
    requests: list
    rows: list
    outputs: list
    reasons: list
    t_start: float
    on_emit: "Callable[[int, list, bool], None] | None" = None
    measured_before: float = 0.0  # machine_cache.measuring_seconds() at the start

    @property
    def done(self) -> bool:
        return not self.rows


def _run_clock() -> float:
    """Seconds of wall time less those spent measuring the machine
    (:func:`~specdec_kernels.decoding.machine_cache.measuring_seconds`: once per model and
    machine, inside the first run that needs it), so that a run's timings are its own."""
    return time.perf_counter() - machine_cache.measuring_seconds()


@dataclass
class EngineOutput:
    """Tokens emitted per request (prompt excluded) and the run's statistics."""

    tokens: list
    finish_reasons: list
    stats: RunStats


class StopCriteria:
    """Per-request stop conditions: EOS ids, stop strings (needs a tokenizer), max new tokens,
    and a minimum number of new tokens before EOS may be emitted.

    Parameters
    ----------
    max_new_tokens : list of int
    eos_ids : set of int
    stop_strings : list of list of str
        Per request; output ends with the token that completes the first stop string.
    tokenizer : optional
        Decodes the tail of the output to look for stop strings.
    min_new_tokens : list of int, optional
        Per request: the EOS ids get zero probability in the target's distribution until this
        many tokens were emitted (Hugging Face's ``min_new_tokens``); 0 for all by default.
    """

    def __init__(self, max_new_tokens, eos_ids, stop_strings, tokenizer, min_new_tokens=None):
        self.max_new_tokens = list(max_new_tokens)
        self.min_new_tokens = list(min_new_tokens or [0] * len(self.max_new_tokens))
        self.eos_ids = set(eos_ids)
        self.stop_strings = [list(s) for s in stop_strings]
        self.tokenizer = tokenizer
        longest = max((len(s) for ss in self.stop_strings for s in ss), default=0)
        self._window = longest + 8  # tokens decoded to look for a stop string

    def cut(self, request: int, generated: list, num_new: int):
        """Where to end ``generated`` (which just grew by ``num_new``), and why.

        Returns
        -------
        (int, str) or (None, None)
            The output length to keep and the finish reason, or ``(None, None)`` to go on.
        """
        limit = self.max_new_tokens[request]
        stops = self.stop_strings[request]
        for j in range(len(generated) - num_new, len(generated)):
            if generated[j] in self.eos_ids:
                return j + 1, "eos"
            if stops:
                tail = self.tokenizer.decode(generated[max(0, j + 1 - self._window) : j + 1])
                if any(s in tail for s in stops):
                    return j + 1, "stop_string"
            if j + 1 >= limit:
                return j + 1, "length"
        return None, None


class Engine:
    """Speculative (or plain) decoding of a batch of requests on one target model.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The target, unmodified.
    drafter : Drafter, optional
        Proposes drafts; plain autoregressive decoding when ``None``.
    tokenizer : optional
        The target's tokenizer (for stop strings and drafter compatibility checks).
    cpu_kernels : bool, optional
        The package's batch-invariant CPU kernels for the forwards (default: where they
        measure faster than torch's on this machine; ``stats.kernels`` says which ran); see
        :class:`~specdec_kernels.decoding.runner.ModelRunner` (drafter models follow).
    """

    def __init__(
        self, model, drafter: Drafter | None = None, tokenizer=None, *,
        cpu_kernels: bool | None = None,
    ):
        self.runner = ModelRunner(model, cpu_kernels=cpu_kernels)
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.tokenizer = tokenizer
        # Bound first: a drafter may learn its capture points from the target or its files.
        self.drafter.bind(self.runner, tokenizer)
        try:
            self.features = FeatureSpec.of(self.drafter.target_features)
            if self.features is not None:
                self.features.resolve(self.runner.num_layers)
        except ValueError as error:
            raise ValueError(f"drafter {self.drafter.name!r}: {error}") from None
        if self.features is not None:
            self.runner.decoder_parts()  # the capture points must be reachable
        width = self.drafter.max_block_width()
        if width > MAX_BLOCK_WIDTH:  # before the cache is sized by it
            raise ValueError(
                f"drafter {self.drafter.name!r} asks for blocks of {width} tokens; "
                f"{BLOCK_LIMIT_REASON}"
            )

    def run(
        self,
        prompts: list,
        params: SamplingParams,
        stop: StopCriteria,
        on_emit: "Callable[[int, list, bool], None] | None" = None,
        *,
        prefill_progress=None,
    ) -> EngineOutput:
        """Decode every prompt until it stops (:meth:`start`, :meth:`step` until done,
        :meth:`finish`).

        Parameters
        ----------
        prompts : list of list of int
            Token ids per request (non-empty).
        params : SamplingParams
            Per-request sampling parameters on the model's device.
        stop : StopCriteria
        on_emit : callable, optional
            ``on_emit(request, tokens, finished)`` after every step (see :meth:`start`).
        prefill_progress : callable, optional
            See :meth:`start`.

        Returns
        -------
        EngineOutput
        """
        generation = self.start(prompts, params, stop, on_emit, prefill_progress=prefill_progress)
        while not generation.done:
            self.step(generation)
        return self.finish(generation)

    @torch.inference_mode()
    def start(
        self,
        prompts: list,
        params: SamplingParams,
        stop: StopCriteria,
        on_emit: "Callable[[int, list, bool], None] | None" = None,
        *,
        prefill_progress=None,
    ) -> "Generation":
        """Prefill the target (and the drafter) and return the run's state.

        ``on_emit(request, tokens, finished)``, when given, is called after every step for each
        request that emitted tokens: ``tokens`` are its new tokens (cut at its stop condition)
        and ``finished`` tells whether the request ended with them. ``prefill_progress(done,
        total)`` is called with the prompt tokens prefilled so far when the target's prefill
        runs in chunks (:meth:`ModelRunner.prefill`).
        """
        t_start = _run_clock()
        measured_before = machine_cache.measuring_seconds()
        batch = len(prompts)
        device = self.runner.device
        stats = RunStats(
            method=self.drafter.name, drafter=self.drafter.describe(), batch_size=batch,
            kernels=self.runner.kernels.describe(),
        )
        capacity = max(len(p) for p in prompts) + max(stop.max_new_tokens)
        capacity += self.drafter.max_block_width()
        cache = self.runner.new_cache(batch, capacity)

        # Prefill: everything but the last prompt token, which becomes the pending token.
        prefill = [p[:-1] for p in prompts]
        want = self.features is not None
        last = self.runner.prefill(
            cache, prefill, progress=prefill_progress, want_features=self.features or False
        )
        counts = None
        if want and self.features.prompt_rows == "all":  # every prefilled row, ragged
            counts = torch.tensor([len(p) for p in prefill], dtype=torch.int64)
            if last.shape[1] == 0:  # one-token prompts only: one zero row to gather from
                last = last.new_zeros(batch, 1, last.shape[2])
            features = last
        else:
            features = last[:, None] if want else None
        state = DecodeState(
            runner=self.runner,
            cache=cache,
            contexts=[list(p) for p in prompts],
            pending=torch.tensor([p[-1] for p in prompts], dtype=torch.int64, device=device),
            params=params,
            draft_params=_draft_params(params),
            offsets=torch.zeros(batch, dtype=torch.int64, device=device),
            greedy=bool((params.temperature <= 0).all()),  # one device read per run
            remaining=list(stop.max_new_tokens),
        )
        if features is not None:
            state.features = features
            state.feature_counts = (
                torch.ones(batch, dtype=torch.int64, device=device) if counts is None
                else counts.to(device, non_blocking=True)
            )
        self.drafter.start(state)
        stats.prefill_seconds = _run_clock() - t_start
        return Generation(
            state=state,
            stop=stop,
            stats=stats,
            requests=[RequestStats(prompt_tokens=len(p)) for p in prompts],
            rows=list(range(batch)),
            outputs=[[] for _ in range(batch)],
            reasons=[""] * batch,
            t_start=t_start,
            on_emit=on_emit,
            measured_before=measured_before,
        )

    @torch.inference_mode()
    def step(self, gen: "Generation") -> None:
        """One propose -> verify -> commit step for every running request."""
        state, stop, stats = gen.state, gen.stop, gen.stats
        t0 = _run_clock()
        proposal = self.drafter.propose(state)
        if not isinstance(proposal, Proposal):
            raise TypeError(f"a drafter returned {type(proposal).__name__}, not a Proposal")
        t1 = _run_clock()
        eos_blocked = [stop.min_new_tokens[req] - len(gen.outputs[req]) for req in gen.rows]
        num_accepted, emitted, seen = self._verify_and_commit(
            state, proposal, eos_blocked if max(eos_blocked) > 0 else None, stop.eos_ids
        )
        stats.target_forwards += 1
        previous_starts = list(state.cache.host_lens)
        state.cache.advance_host([n + 1 for n in num_accepted])
        finished = []
        for b, req in enumerate(gen.rows):
            new = emitted[b]
            before = len(gen.outputs[req])
            state.contexts[b].extend(new)
            gen.outputs[req].extend(new)
            gen.requests[req].record_step(proposal.depths[b], num_accepted[b])
            keep, reason = stop.cut(req, gen.outputs[req], len(new))
            if reason is not None:
                del gen.outputs[req][keep:]
                gen.reasons[req] = reason
                gen.requests[req].seconds = _run_clock() - gen.t_start
                finished.append(b)
            if gen.on_emit is not None:
                gen.on_emit(req, gen.outputs[req][before:], reason is not None)
            state.remaining[b] = stop.max_new_tokens[req] - len(gen.outputs[req])
        t2 = _run_clock()
        self.drafter.accept(state, StepOutcome(previous_starts, num_accepted, **seen))
        stats.drafter_seconds += (t1 - t0) + (_run_clock() - t2)
        if finished:
            keep_rows = [b for b in range(len(gen.rows)) if b not in finished]
            gen.rows = [gen.rows[b] for b in keep_rows]
            if gen.rows:
                self._select(state, keep_rows)

    def finish(self, gen: "Generation") -> EngineOutput:
        """Outputs and statistics of a run (call once :attr:`Generation.done`)."""
        for req, out in enumerate(gen.outputs):
            gen.requests[req].new_tokens = len(out)
            gen.requests[req].finish_reason = gen.reasons[req]
        gen.stats.requests = gen.requests
        gen.stats.seconds = _run_clock() - gen.t_start
        gen.stats.measuring_seconds = machine_cache.measuring_seconds() - gen.measured_before
        gen.stats.drafter_report = self.drafter.report()  # the drafter-statistics doorway
        # Settings as they stood at the end: a drafter may state some from what it measured.
        gen.stats.drafter = self.drafter.describe()
        self.drafter.finish()
        self.runner.release()
        return EngineOutput(gen.outputs, gen.reasons, gen.stats)

    def _verify_and_commit(self, state: DecodeState, proposal: Proposal, eos_blocked=None,
                           eos_ids=()):
        """Target forward over the block, the proposal's acceptance rule, KV commit; one device
        read.

        ``eos_blocked[b]``: the block rows of request ``b`` at depth below it get the EOS ids
        masked out of the target logits (``min_new_tokens``); ``None`` when no row needs it.
        Returns the accepted counts and emitted tokens per request, and what the drafter
        sees of the forward (:class:`StepOutcome`'s ``logits``, ``tree_width``, ``tokens``,
        ``parents``, ``accepted_rows``; device tensors)."""
        tokens, parents = proposal.block(state.pending)
        width, extra = tokens.shape[1], proposal.extra
        logits, hidden = self._forward(state, tokens, parents, extra)
        verified = logits if extra is None else logits[:, :width].contiguous()
        if eos_blocked is not None and eos_ids:
            depth = ops.build_tree_masks(parents, torch.zeros_like(parents[:, 0])).depth
            verified = _mask_eos(verified, depth, eos_blocked, eos_ids)
        # Error checks wait for the step's one sync (below) instead of adding one.
        with ops.deferred_errors():
            verdict = proposal.verify(verified, state.params, state.offsets)
        kept = self._commit(state, verdict, hidden)
        # Each request's random streams move past every position its verification could use.
        used = (parents != PAD_PARENT).sum(1)
        if extra is not None:
            used = used + (extra.positions >= 0).sum(1)
        state.offsets = state.offsets + used
        host = torch.cat([verdict.num_accepted[:, None], verdict.tokens], 1).tolist()  # the sync
        ops.raise_deferred_errors()  # the verification's error codes landed by that sync
        accepted = [row[0] for row in host]
        emitted = [row[1 : n + 2] for row, n in zip(host, accepted)]
        seen = dict(
            logits=logits, tree_width=width,
            tokens=torch.where(parents != PAD_PARENT, tokens, -1), parents=parents,
            accepted_rows=torch.where(kept, verdict.rows, -1),
        )
        return accepted, emitted, seen

    def _forward(self, state: DecodeState, tokens, parents, extra):
        """The target's logits over the block then its extra rows (run with the block, never
        verified: drafter.ExtraRows), and the target features the drafter asks for."""
        if extra is not None:
            tokens = torch.cat([tokens, extra.tokens], 1)
        want = self.features is not None
        out = self.runner.forward(state.cache, tokens, state.cache.host_lens, parents,
                                  extra=extra, features=self.features or False)
        return out if want else (out, None)

    def _commit(self, state: DecodeState, verdict: Verdict, hidden) -> torch.Tensor:
        """Keep the accepted path's K/V (and features), make each next token pending; returns
        which entries of ``verdict.rows`` are on the accepted path (``[B, P]`` bool)."""
        rows, counts = verdict.rows, verdict.num_accepted + 1
        keep = torch.arange(rows.shape[1], device=rows.device)[None, :] < counts[:, None]
        positions = torch.where(keep, state.cache.lens[:, None] + rows, torch.full_like(rows, -1))
        state.cache.compact(positions, counts)
        if hidden is not None:  # the accepted rows' features, in path order (device only)
            index = rows.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1])
            state.features = hidden.gather(1, index)
            state.feature_counts = counts
        state.pending = verdict.tokens.gather(1, verdict.num_accepted[:, None]).squeeze(1)
        return keep

    def _select(self, state: DecodeState, keep_rows: list) -> None:
        index = torch.tensor(keep_rows, dtype=torch.int64, device=state.pending.device)
        state.cache.select_requests(keep_rows)
        state.contexts = [state.contexts[b] for b in keep_rows]
        state.remaining = [state.remaining[b] for b in keep_rows]
        state.pending = state.pending.index_select(0, index)
        state.offsets = state.offsets.index_select(0, index)
        state.params = state.params.select(index)
        state.draft_params = state.draft_params.select(index)
        if state.features is not None:
            state.features = state.features.index_select(0, index)
            state.feature_counts = state.feature_counts.index_select(0, index)
        self.drafter.select_requests(keep_rows)


def _mask_eos(logits, depth, eos_blocked: list, eos_ids) -> torch.Tensor:
    """``logits`` with the EOS ids at -inf in the rows whose depth (tokens after the pending
    one) is below ``eos_blocked[b]``: those rows predict output tokens before the minimum."""
    limit = torch.tensor(eos_blocked, dtype=torch.int64).to(logits.device, non_blocking=True)
    blocked = (depth >= 0) & (depth < limit.unsqueeze(1))
    ids = sorted(i for i in eos_ids if 0 <= i < logits.shape[2])
    eos = torch.tensor(ids, dtype=torch.int64, device=logits.device)
    masked = logits.index_select(2, eos).masked_fill(blocked.unsqueeze(2), float("-inf"))
    return logits.index_copy(2, eos, masked)


def _draft_params(params: SamplingParams) -> SamplingParams:
    """The target's sampling parameters with seeds for an independent random stream."""
    return dataclasses.replace(params, seed=params.seed ^ _DRAFT_SEED_SALT)
