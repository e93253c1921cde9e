"""End-to-end processing latency: how long messages took from publish to FIN, over a sliding window.

nsqd reports, per channel and per topic, quantiles of ``FIN time - publish timestamp`` when
``--e2e-processing-latency-percentile`` is given, computed over ``--e2e-processing-latency-window-time``
(default 10 minutes). Like nsqd, the window is two buckets of half the window each: samples go to the
current bucket; once it is half a window old the previous bucket is dropped and the current one takes its
place. A query therefore covers between half a window and a whole window of samples.

The buckets hold raw samples (integer nanoseconds), so recording one is a clock read and a list append.
Each bucket keeps at most ``max_samples``; beyond that new samples overwrite the oldest ones in ring
order, so a busy channel keeps the most recent ``max_samples`` of its bucket while ``count`` still counts
every FIN. Quantiles are computed when asked for (``/stats``, ``/metrics``, statsd) by sorting the samples:
nearest rank, ``value = sorted[ceil(q * n) - 1]``. nsqd uses a streaming estimator with a small error;
exact ranks on a bounded sample are at least as good and cost nothing on the FIN path.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_SAMPLES", "E2ELatency", "E2EResult", "merge_results", "quantile_values"]

#: samples kept per bucket (two buckets per channel): 8 bytes each in a list, ~0.3 MB per channel at most
DEFAULT_MAX_SAMPLES = 20000


@dataclass(frozen=True, slots=True)
class E2EResult:
    """One window's figures: ``count`` samples and ``(quantile, value_ns)`` pairs in configured order,
    or ``percentiles=None`` when no percentiles are configured (nsqd's ``null``)."""

    count: int = 0
    percentiles: tuple[tuple[float, float], ...] | None = None
    samples: tuple[int, ...] = ()  # kept for merging channels into their topic's figures

    def __repr__(self) -> str:
        return f"E2EResult(count={self.count}, percentiles={self.percentiles})"


EMPTY = E2EResult()


def quantile_values(sorted_samples: list[int], quantiles) -> tuple[tuple[float, float], ...]:
    """Nearest-rank quantiles of already sorted samples; 0.0 for every quantile when there are none."""
    n = len(sorted_samples)
    values = []
    for q in quantiles:
        if n == 0:
            values.append((q, 0.0))
            continue
        rank = min(max(math.ceil(q * n), 1), n)
        values.append((q, float(sorted_samples[rank - 1])))
    return tuple(values)


class E2ELatency:
    """The two-bucket window of one channel. ``add(publish_ts_ns)`` is called at every FIN."""

    __slots__ = (
        "quantiles",
        "half_window_ns",
        "max_samples",
        "_current",
        "_previous",
        "_current_count",
        "_previous_count",
        "_rotate_at",
        "_next",
    )

    def __init__(
        self, quantiles, window_seconds: float, *, max_samples: int = DEFAULT_MAX_SAMPLES, now_ns: int | None = None
    ) -> None:
        assert max_samples > 0
        self.quantiles = tuple(quantiles)
        self.half_window_ns = max(int(window_seconds * 1e9) // 2, 1)
        self.max_samples = max_samples
        self._current: list[int] = []
        self._previous: list[int] = []
        self._current_count = 0
        self._previous_count = 0
        self._rotate_at = (time.time_ns() if now_ns is None else now_ns) + self.half_window_ns
        self._next = 0  # ring position once the current bucket is full

    def add(self, publish_ts_ns: int, now_ns: int | None = None) -> None:
        if now_ns is None:
            now_ns = time.time_ns()
        if now_ns >= self._rotate_at:
            self._rotate(now_ns)
        current = self._current
        self._current_count += 1
        if len(current) < self.max_samples:
            current.append(now_ns - publish_ts_ns)
        else:
            position = self._next
            current[position] = now_ns - publish_ts_ns
            self._next = position + 1 if position + 1 < self.max_samples else 0

    def _rotate(self, now_ns: int) -> None:
        """Drop the previous bucket and start a new current one; two half-windows of silence drop both."""
        if now_ns >= self._rotate_at + self.half_window_ns:
            self._previous = []
            self._previous_count = 0
        else:
            self._previous = self._current
            self._previous_count = self._current_count
        self._current = []
        self._current_count = 0
        self._next = 0
        # keep bucket edges on the half-window grid of the first one
        late = (now_ns - self._rotate_at) // self.half_window_ns
        self._rotate_at += (late + 1) * self.half_window_ns

    @property
    def count(self) -> int:
        return self._current_count + self._previous_count

    def state(self, now_ns: int) -> tuple[int, int, int]:
        """What ``result(now_ns)`` depends on: the bucket edge and the bucket counts (a sample is recorded with a
        count, a rotation moves the edge). A stale window is rotated first, as ``result`` does."""
        if now_ns >= self._rotate_at:
            self._rotate(now_ns)
        return self._rotate_at, self._current_count, self._previous_count

    def result(self, now_ns: int | None = None) -> E2EResult:
        """The figures of the window ending now (a stale window is rotated first, so an idle channel's old
        samples expire even without new FINs)."""
        if now_ns is None:
            now_ns = time.time_ns()
        if now_ns >= self._rotate_at:
            self._rotate(now_ns)
        samples = self._previous + self._current
        samples.sort()
        return E2EResult(self.count, quantile_values(samples, self.quantiles), tuple(samples))


def merge_results(results, quantiles) -> E2EResult:
    """A topic's figures from its channels' results (nsqd merges the channels' windows); ``EMPTY`` (count 0,
    percentiles null) when no channel tracks latency."""
    tracked = [r for r in results if r.percentiles is not None]
    if not tracked:
        return EMPTY
    samples = sorted(s for r in tracked for s in r.samples)
    return E2EResult(sum(r.count for r in tracked), quantile_values(samples, quantiles), ())
