"""The decoding loop: prefill, then one shared step until every request stops.

Each step: the drafter proposes (a chain or a tree) -> the target verifies the whole block in
one forward -> the verification op decides -> the KV op commits the accepted path -> tokens
are emitted. Methods differ only in the drafter. The step reads the device once, to learn
what was accepted.

Before the first step the target has seen each prompt but its last token, which becomes the
request's *pending* token (emitted, K/V not yet cached): the first step verifies drafts too.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from specdec_kernels.decoding import step
from specdec_kernels.decoding.drafter import (
    ChainProposal,
    DecodeState,
    Drafter,
    NoDrafter,
    StepOutcome,
    TreeProposal,
)
from specdec_kernels.decoding.runner import ModelRunner
from specdec_kernels.decoding.stats import RequestStats, RunStats

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

    @property
    def done(self) -> bool:
        return not self.rows


@dataclass
class EngineOutput:
    """Tokens emitted per request (prompt excluded) and the run's statistics."""

    tokens: list
    finish_reasons: list
    stats: RunStats


class StopCriteria:
    """Per-request stop conditions: EOS ids, stop strings (needs a tokenizer), max new tokens.

    Parameters
    ----------
    max_new_tokens : list of int
    eos_ids : set of int
    stop_strings : list of list of str
        Per request; output ends with the token that completes the first stop string.
    tokenizer : optional
        Decodes the tail of the output to look for stop strings.
    """

    def __init__(self, max_new_tokens, eos_ids, stop_strings, tokenizer):
        self.max_new_tokens = list(max_new_tokens)
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
    fast_cpu_linear : bool
        See :class:`~specdec_kernels.decoding.runner.ModelRunner` (drafter models follow).
    """

    def __init__(
        self, model, drafter: Drafter | None = None, tokenizer=None, *, fast_cpu_linear=False
    ):
        self.runner = ModelRunner(model, fast_cpu_linear=fast_cpu_linear)
        self.drafter = drafter if drafter is not None else NoDrafter()
        self.tokenizer = tokenizer
        self.drafter.bind(self.runner, tokenizer)

    def run(self, prompts: list, params: step.SamplingParams, stop: StopCriteria) -> EngineOutput:
        """Decode every prompt until it stops (:meth:`start`, :meth:`step` until done,
        :meth:`finish`).

        Parameters
        ----------
        prompts : list of list of int
            Token ids per request (non-empty).
        params : SamplingParams
            Per-request sampling parameters on the model's device.
        stop : StopCriteria

        Returns
        -------
        EngineOutput
        """
        generation = self.start(prompts, params, stop)
        while not generation.done:
            self.step(generation)
        return self.finish(generation)

    @torch.inference_mode()
    def start(self, prompts: list, params: step.SamplingParams, stop: StopCriteria) -> "Generation":
        """Prefill the target (and the drafter) and return the run's state."""
        t_start = time.perf_counter()
        batch = len(prompts)
        device = self.runner.device
        stats = RunStats(
            method=self.drafter.name, drafter=self.drafter.describe(), batch_size=batch
        )
        capacity = max(len(p) for p in prompts) + max(stop.max_new_tokens)
        capacity += self.drafter.max_block_width() + 4  # blocks may be padded to 4 rows
        cache = self.runner.new_cache(batch, capacity)

        # Prefill: everything but the last prompt token, which becomes the pending token.
        self.runner.append(cache, [p[:-1] for p in prompts])
        state = DecodeState(
            runner=self.runner,
            cache=cache,
            contexts=[list(p) for p in prompts],
            pending=torch.tensor([p[-1] for p in prompts], dtype=torch.int64, device=device),
            params=params,
            draft_params=_draft_params(params),
            offsets=torch.zeros(batch, dtype=torch.int64, device=device),
            greedy=step.all_greedy(params),
            remaining=list(stop.max_new_tokens),
        )
        self.drafter.start(state)
        stats.prefill_seconds = time.perf_counter() - t_start
        return Generation(
            state=state,
            stop=stop,
            stats=stats,
            requests=[RequestStats(prompt_tokens=len(p)) for p in prompts],
            rows=list(range(batch)),
            outputs=[[] for _ in range(batch)],
            reasons=[""] * batch,
            t_start=t_start,
        )

    @torch.inference_mode()
    def step(self, gen: "Generation") -> None:
        """One propose -> verify -> commit step for every running request."""
        state, stop, stats = gen.state, gen.stop, gen.stats
        t0 = time.perf_counter()
        proposal = self.drafter.propose(state)
        t1 = time.perf_counter()
        num_accepted, emitted = self._verify_and_commit(state, proposal)
        stats.target_forwards += 1
        previous_starts = list(state.cache.host_lens)
        state.cache.advance_host([n + 1 for n in num_accepted])
        finished = []
        for b, req in enumerate(gen.rows):
            new = emitted[b]
            state.contexts[b].extend(new)
            gen.outputs[req].extend(new)
            gen.requests[req].record_step(proposal.depths[b], num_accepted[b])
            keep, reason = stop.cut(req, gen.outputs[req], len(new))
            if reason is not None:
                del gen.outputs[req][keep:]
                gen.reasons[req] = reason
                gen.requests[req].seconds = time.perf_counter() - gen.t_start
                finished.append(b)
            state.remaining[b] = stop.max_new_tokens[req] - len(gen.outputs[req])
        t2 = time.perf_counter()
        self.drafter.accept(state, StepOutcome(previous_starts, num_accepted))
        stats.drafter_seconds += (t1 - t0) + (time.perf_counter() - t2)
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
        gen.stats.seconds = time.perf_counter() - gen.t_start
        return EngineOutput(gen.outputs, gen.reasons, gen.stats)

    def _verify_and_commit(self, state: DecodeState, proposal):
        """Target forward over the block, verification, KV commit; one device read."""
        runner, cache = self.runner, state.cache
        if isinstance(proposal, ChainProposal):
            block = torch.cat([state.pending[:, None], proposal.tokens], 1)
            logits = runner.forward(cache, block, cache.host_lens)
            # K = 0 (plain decoding) goes through the same op: one random stream per method.
            tokens, num_accepted = step.verify_chain(
                proposal.tokens,
                proposal.num_draft,
                logits,
                proposal.probs,
                state.params,
                state.offsets,
            )
            rows = torch.arange(block.shape[1], device=block.device).expand_as(block)
            used = proposal.num_draft + 1
        elif isinstance(proposal, TreeProposal):
            block = proposal.tokens
            logits = runner.forward(cache, block, cache.host_lens, proposal.parents)
            nodes, tokens, num_accepted = step.verify_tree(
                block, proposal.parents, logits, proposal.probs, state.params, state.offsets
            )
            rows = torch.cat([torch.zeros_like(nodes[:, :1]), nodes[:, :-1]], 1)
            used = (proposal.parents != -2).sum(1)
        else:
            raise TypeError(f"a drafter returned {type(proposal).__name__}, not a proposal")

        counts = num_accepted + 1
        keep = torch.arange(rows.shape[1], device=rows.device)[None, :] < counts[:, None]
        positions = torch.where(keep, cache.lens[:, None] + rows, torch.full_like(rows, -1))
        cache.compact(positions, counts)
        state.pending = tokens.gather(1, num_accepted[:, None]).squeeze(1)
        # Each request's random streams move past every position its verification could use.
        state.offsets = state.offsets + used
        host = torch.cat([num_accepted[:, None], tokens], 1).tolist()  # the step's one sync
        accepted = [row[0] for row in host]
        emitted = [row[1 : n + 2] for row, n in zip(host, accepted)]
        return accepted, emitted

    def _select(self, state: DecodeState, keep_rows: list) -> None:
        index = torch.tensor(keep_rows, dtype=torch.int64, device=state.pending.device)
        state.cache.select_requests(keep_rows)
        state.contexts = [state.contexts[b] for b in keep_rows]
        state.remaining = [state.remaining[b] for b in keep_rows]
        state.pending = state.pending.index_select(0, index)
        state.offsets = state.offsets.index_select(0, index)
        state.params = step.select_params(state.params, index)
        state.draft_params = step.select_params(state.draft_params, index)
        self.drafter.select_requests(keep_rows)


def _draft_params(params: step.SamplingParams) -> step.SamplingParams:
    """The target's sampling parameters with seeds for an independent random stream."""
    return dataclasses.replace(params, seed=params.seed ^ _DRAFT_SEED_SALT)
