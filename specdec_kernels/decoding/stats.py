"""Statistics every decoder reports: tokens/s, target forwards, drafter time share, mean
accepted length tau (tokens emitted per target forward) and acceptance per draft position."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["RequestStats", "RunStats"]


def _grow(counts: list, size: int) -> None:
    if len(counts) < size:
        counts.extend([0] * (size - len(counts)))


@dataclass
class RequestStats:
    """One request's figures.

    Attributes
    ----------
    prompt_tokens, new_tokens : int
    target_forwards : int
        Verification forwards of the target while the request ran (its prefill excluded).
    seconds : float
        Wall time from the start of the run until the request finished.
    finish_reason : str
        ``"eos"``, ``"stop_string"`` or ``"length"``.
    proposed_at, accepted_at : list of int
        ``proposed_at[i]``: steps that drafted a token at depth ``i + 1``;
        ``accepted_at[i]``: steps where that depth was accepted.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    seconds: float = 0.0
    finish_reason: str = ""
    proposed_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)

    def record_step(self, depth: int, accepted: int) -> None:
        self.target_forwards += 1
        _grow(self.proposed_at, depth)
        _grow(self.accepted_at, depth)
        for i in range(depth):
            self.proposed_at[i] += 1
        for i in range(min(accepted, depth)):
            self.accepted_at[i] += 1

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target forward."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate_at(self) -> list:
        """Accepted / proposed per draft depth."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            tau=self.tau,
            tokens_per_second=self.tokens_per_second,
            acceptance_rate_at=self.acceptance_rate_at,
        )
        return out


@dataclass
class RunStats:
    """Figures of one :func:`~specdec_kernels.generate` call (all requests together).

    Attributes
    ----------
    method : str
        The drafter's name (``"autoregressive"`` without one).
    drafter : dict
        The drafter's settings as :meth:`Drafter.describe` states them at the end of the run.
    batch_size : int
    seconds, prefill_seconds, drafter_seconds : float
        Wall time of the whole call (model loading excluded), of the prefill (target and
        drafter), and spent in the drafter (proposing and updating itself) during decoding;
        the time of ``measuring_seconds`` left out of all three.
    measuring_seconds : float
        Wall time spent during the call measuring the machine (kernel paths, step and draft
        costs: once per model and machine, :mod:`~specdec_kernels.decoding.machine_cache`);
        0 once they are kept.
    target_forwards : int
        Verification forwards of the target (prefill excluded); with a batch, one forward
        serves every running request.
    requests : list of RequestStats
    drafter_report : dict
        What the drafter measured about itself (:meth:`Drafter.report`), e.g. per-prophet
        nodes proposed, accepted and share of emitted tokens for a merged drafter.
    kernels : dict
        Which kernels the target's forwards ran and why
        (:meth:`~specdec_kernels.decoding.kernel_choice.KernelChoice.describe`).
    """

    method: str = ""
    drafter: dict = field(default_factory=dict)
    batch_size: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    drafter_seconds: float = 0.0
    measuring_seconds: float = 0.0
    target_forwards: int = 0
    requests: list = field(default_factory=list)
    drafter_report: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    @property
    def tokens_per_second(self) -> float:
        """New tokens of all requests per second of the whole call."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_seconds(self) -> float:
        return max(self.seconds - self.prefill_seconds, 0.0)

    @property
    def drafter_time_share(self) -> float:
        """Fraction of the decoding time spent in the drafter."""
        return self.drafter_seconds / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward, per request (sum over requests)."""
        forwards = sum(r.target_forwards for r in self.requests)
        return self.new_tokens / forwards if forwards else 0.0

    @property
    def proposed_at(self) -> list:
        return _sum_columns([r.proposed_at for r in self.requests])

    @property
    def accepted_at(self) -> list:
        return _sum_columns([r.accepted_at for r in self.requests])

    @property
    def acceptance_rate_at(self) -> list:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    def to_dict(self) -> dict:
        """Everything as plain Python values (JSON-ready)."""
        return {
            "method": self.method,
            "drafter": dict(self.drafter),
            "batch_size": self.batch_size,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "drafter_seconds": self.drafter_seconds,
            "measuring_seconds": self.measuring_seconds,
            "drafter_time_share": self.drafter_time_share,
            "tokens_per_second": self.tokens_per_second,
            "target_forwards": self.target_forwards,
            "tau": self.tau,
            "proposed_at": self.proposed_at,
            "accepted_at": self.accepted_at,
            "acceptance_rate_at": self.acceptance_rate_at,
            "requests": [r.to_dict() for r in self.requests],
            "drafter_report": self.drafter_report,
            "kernels": dict(self.kernels),
        }

    def summary(self) -> str:
        """One line for humans."""
        rates = " ".join(f"{r:.2f}" for r in self.acceptance_rate_at[:8])
        return (
            f"{self.method}: {self.new_tokens} tokens in {self.seconds:.2f}s "
            f"({self.tokens_per_second:.1f} tok/s), {self.target_forwards} target forwards, "
            f"tau {self.tau:.2f}, drafter {100 * self.drafter_time_share:.0f}% of decode time"
            + (f", acceptance by depth [{rates}]" if rates else "")
            + _prophet_summary(self.drafter_report)
            + _kernel_summary(self.kernels)
            + (f"; first measured this machine's costs ({self.measuring_seconds:.1f}s, once; "
               "not counted above)" if self.measuring_seconds > 0 else "")
        )


def _kernel_summary(kernels: dict) -> str:
    """``; package kernels (avx2)`` where the run said which kernels it used."""
    if not kernels or kernels.get("isa", "-") == "-":
        return ""
    return f"; {kernels['path']} kernels ({kernels['isa']})"


def _prophet_summary(report: dict) -> str:
    """``; prophets: name share%`` for a merged drafter's report, else nothing."""
    prophets = report.get("prophets") if report else None
    if not prophets:
        return ""
    parts = [f"{name} {100 * p['share_of_emitted_tokens']:.0f}%" for name, p in prophets.items()]
    return "; share of emitted tokens by prophet: " + ", ".join(parts)


def _sum_columns(rows: list) -> list:
    width = max((len(r) for r in rows), default=0)
    return [sum(r[i] for r in rows if i < len(r)) for i in range(width)]
