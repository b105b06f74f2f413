"""The benchmark's progress bar: the run in progress by name, and a time estimate from
per-method mean durations (runs of different methods differ up to ~10x in length, so an
estimate from the mean of all runs so far swings with the shuffled order)."""

from __future__ import annotations

import sys
import time

__all__ = ["BenchProgress", "RemainingTime"]


class RemainingTime:
    """Estimates the time left of a benchmark from each method's mean run duration.

    Parameters
    ----------
    runs_per_method : dict of str -> int
        How many timed runs each method will make.
    """

    def __init__(self, runs_per_method: dict):
        self.left = dict(runs_per_method)
        self.durations: dict = {name: [] for name in runs_per_method}

    def finished(self, method: str, seconds: float) -> None:
        """Record a finished run of ``method`` that took ``seconds``."""
        self.left[method] -= 1
        self.durations[method].append(seconds)

    def mean(self, method: str) -> float | None:
        """Mean duration of ``method``'s runs; the mean over measured methods for a method
        not run yet; None before any run."""
        runs = self.durations[method]
        if runs:
            return sum(runs) / len(runs)
        means = [sum(d) / len(d) for d in self.durations.values() if d]
        return sum(means) / len(means) if means else None

    def seconds_left(self, running: str | None = None, elapsed: float = 0.0) -> float | None:
        """Estimated seconds until every run has finished.

        Parameters
        ----------
        running : str, optional
            The method of the run in progress (counted among the runs left).
        elapsed : float
            How long that run has been going; its estimate never drops below zero.

        Returns
        -------
        float or None
            None until a first run has finished.
        """
        total = 0.0
        for method, left in self.left.items():
            if left <= 0:
                continue
            mean = self.mean(method)
            if mean is None:
                return None
            total += left * mean
            if method == running:
                total -= min(elapsed, mean)
        return total


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class BenchProgress:
    """``progress(method, label, seconds)`` callback of
    :func:`~specdec_kernels.bench.harness.run_benchmark` drawing a tqdm bar: the description
    names the run in progress, the postfix the estimate of :class:`RemainingTime` (tqdm's own
    rate-based estimate is left out).

    Parameters
    ----------
    runs_per_method : dict of str -> int
    file : text stream, optional
        Where the bar is drawn (stderr by default).
    """

    def __init__(self, runs_per_method: dict, file=None):
        from tqdm import tqdm

        self.remaining = RemainingTime(runs_per_method)
        self.bar = tqdm(
            total=sum(runs_per_method.values()),
            unit="run",
            file=file or sys.stderr,
            bar_format="{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} "
            "[{elapsed}{postfix}]",
        )
        self.bar.set_description_str("warm-up")
        self._running: str | None = None
        self._started = 0.0

    def __call__(self, method: str, label: str, seconds: float | None) -> None:
        if seconds is None:  # a run starts
            self._running, self._started = method, time.perf_counter()
            self.bar.set_description_str(label)
        else:
            self._running = None
            self.remaining.finished(method, seconds)
            self.bar.update()
        self.bar.set_postfix_str(f"~{_clock(self.seconds_left())} left", refresh=True)

    def seconds_left(self) -> float | None:
        """The current estimate (the run in progress counted from its start)."""
        elapsed = time.perf_counter() - self._started if self._running else 0.0
        return self.remaining.seconds_left(self._running, elapsed)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "BenchProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
