"""What nsq_to_http and nsq_to_nsq share: picking a destination per message (``--mode``) and the
``--status-every`` timing lines.

Modes (NSQ 1.3.0 accepts these three for both tools; ``hostpool`` is the default):

- ``round-robin``: a counter walks the destinations in order, one message each, failures or not.
- ``hostpool``: bitly/go-hostpool's standard pool. Round-robin over the destinations that are alive; a request
  that fails marks its destination dead, and a dead one is skipped until its retry time (30 s after the failure,
  the delay doubling at each retry up to 15 min); when it is tried again and succeeds it is alive again. When every
  destination is dead they are all revived and the walk restarts at the first.
- ``epsilon-greedy``: the same pool, but most picks favour the fastest destinations. Each destination keeps its
  response times in 120 buckets covering the last 5 minutes (older buckets count less); a pick is a weighted random
  choice with weights 1/(weighted mean response time). With probability epsilon (0.3 at start, times 0.9 at each
  exploring pick, never below 0.01) the pick is the plain round-robin one instead, so slow or unmeasured
  destinations are still tried.

NSQ's tools silently fall back to a mode (nsq_to_http to sending every message to every destination, nsq_to_nsq
to round-robin) for a ``--mode`` they do not know; here that is a start-up error instead (``check_mode``).

``TimerMetrics`` is bitly/timer_metrics: every ``status_every`` recorded durations it logs
``<prefix> finished <n> - 99th: <ms>ms - 95th: <ms>ms - avg: <ms>ms`` and starts over; 0 disables it. Both tools
keep one labelled ``[aggregate]:`` and, with several destinations, one per destination labelled ``[<address>]:``.

Everything here runs on the trio thread, so no locks: a pick and its mark are plain calls.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable

from runtime.flags import go_quote

__all__ = ["MODES", "Destinations", "TimerMetrics", "check_mode", "destination_metrics"]

log = logging.getLogger("nsq_tools")

MODES = ("round-robin", "hostpool", "epsilon-greedy")

_INITIAL_RETRY_DELAY = 30.0
_MAX_RETRY_DELAY = 900.0
_EPSILON_BUCKETS = 120
_DECAY_DURATION = 300.0
_INITIAL_EPSILON = 0.3
_EPSILON_DECAY = 0.9
_MIN_EPSILON = 0.01


def check_mode(mode: str) -> str | None:
    """The problem with ``--mode``, or None when it names a mode."""
    if mode in MODES:
        return None
    return f"--mode must be one of {', '.join(MODES)} (got {go_quote(mode)})"


class _Host:
    __slots__ = ("address", "dead", "retry_delay", "next_retry", "counts", "totals")

    def __init__(self, address: str) -> None:
        self.address = address
        self.dead = False
        self.retry_delay = _INITIAL_RETRY_DELAY
        self.next_retry = 0.0
        self.counts = [0] * _EPSILON_BUCKETS
        self.totals = [0.0] * _EPSILON_BUCKETS  # milliseconds

    def can_try(self, now: float) -> bool:
        return not self.dead or self.next_retry < now

    def will_retry(self, now: float) -> None:
        self.retry_delay = min(self.retry_delay * 2, _MAX_RETRY_DELAY)
        self.next_retry = now + self.retry_delay


class Destinations:
    """The destination addresses and the ``--mode`` that picks one per message.

    ``pick()`` returns an address; the caller reports the outcome with ``mark(address, ok, seconds)``
    (ignored in round-robin mode). ``clock`` and ``rng`` are injectable for tests."""

    def __init__(
        self,
        addresses: list[str],
        mode: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        assert addresses and mode in MODES
        self.addresses = list(addresses)
        self.mode = mode
        self._clock = clock
        self._rng = rng or random.Random()
        # A repeated address is one host for the pool (go-hostpool keys them by address), but keeps its turns.
        self._hosts = {address: _Host(address) for address in self.addresses}
        self._host_list = list(self._hosts.values())
        self._next = 0
        self._counter = 0
        self._epsilon = _INITIAL_EPSILON
        self._bucket = 0
        self._bucket_started = clock()

    def pick(self) -> str:
        if self.mode == "round-robin":
            # NSQ's tools increment before indexing, so the first message goes to the second address.
            self._counter += 1
            return self.addresses[self._counter % len(self.addresses)]
        if self.mode == "epsilon-greedy":
            return self._pick_greedy()
        return self._pick_alive()

    def mark(self, address: str, ok: bool, seconds: float = 0.0) -> None:
        if self.mode == "round-robin":
            return
        host = self._hosts[address]
        now = self._clock()
        if ok:
            host.dead = False
            if self.mode == "epsilon-greedy":
                self._rotate(now)
                host.counts[self._bucket] += 1
                host.totals[self._bucket] += float(int(seconds * 1000))  # go-hostpool keeps whole ms
        elif not host.dead:
            host.dead = True
            host.retry_delay = _INITIAL_RETRY_DELAY
            host.next_retry = now + host.retry_delay

    def _pick_alive(self) -> str:
        now = self._clock()
        count = len(self._host_list)
        for step in range(count):
            index = (self._next + step) % count
            host = self._host_list[index]
            if not host.dead:
                self._next = index + 1
                return host.address
            if host.next_retry < now:
                host.will_retry(now)
                self._next = index + 1
                return host.address
        for host in self._host_list:
            host.dead = False
        self._next = 0
        return self._host_list[0].address

    def _rotate(self, now: float) -> None:
        """Age the response-time buckets: one bucket per 1/120 of the decay period has passed."""
        per_bucket = _DECAY_DURATION / _EPSILON_BUCKETS
        steps = int((now - self._bucket_started) / per_bucket)
        if steps <= 0:
            return
        self._bucket_started += steps * per_bucket
        for _ in range(min(steps, _EPSILON_BUCKETS)):
            self._bucket = (self._bucket + 1) % _EPSILON_BUCKETS
            for host in self._host_list:
                host.counts[self._bucket] = 0
                host.totals[self._bucket] = 0.0

    def _weighted_mean_ms(self, host: _Host) -> float:
        # Oldest bucket first with weight 1/120, the current one last with weight 1; an empty bucket repeats
        # the last mean seen, as go-hostpool does.
        value = last = 0.0
        for offset in range(1, _EPSILON_BUCKETS + 1):
            position = (self._bucket + offset) % _EPSILON_BUCKETS
            weight = offset / _EPSILON_BUCKETS
            if host.counts[position]:
                last = host.totals[position] / host.counts[position]
            value += last * weight
        return value

    def _pick_greedy(self) -> str:
        if self._rng.random() < self._epsilon:
            self._epsilon = max(self._epsilon * _EPSILON_DECAY, _MIN_EPSILON)
            return self._pick_alive()
        now = self._clock()
        self._rotate(now)
        candidates: list[tuple[_Host, float]] = []
        for host in self._host_list:
            if host.can_try(now):
                mean = self._weighted_mean_ms(host)
                if mean > 0:
                    candidates.append((host, 1.0 / mean))
        total = sum(value for _, value in candidates)
        if not candidates or total <= 0:
            return self._pick_alive()
        pick = self._rng.random()
        ceiling = 0.0
        for host, value in candidates:
            ceiling += value / total
            if pick <= ceiling:
                if host.dead:
                    host.will_retry(now)
                return host.address
        return self._pick_alive()


def _percentile(percent: float, ordered: list[float]) -> float:
    # timer_metrics' index: ceil(p/100 * n + 0.5), capped at the last element.
    index = int(math.ceil(percent / 100.0 * len(ordered) + 0.5))
    return ordered[min(index, len(ordered) - 1)]


class TimerMetrics:
    """Durations (seconds) logged as percentiles every ``status_every`` of them."""

    def __init__(self, status_every: int, prefix: str) -> None:
        self.status_every = status_every
        self.prefix = prefix
        self._durations: list[float] = []

    def status(self, started: float, now: float | None = None) -> None:
        """Record the time since ``started`` (a ``time.monotonic()`` value)."""
        if self.status_every > 0:
            self.record((time.monotonic() if now is None else now) - started)

    def record(self, seconds: float) -> None:
        if self.status_every <= 0:
            return
        self._durations.append(seconds)
        if len(self._durations) < self.status_every:
            return
        ordered = sorted(self._durations)
        self._durations.clear()
        avg_ms = sum(ordered) * 1000 / len(ordered)
        log.info(
            "%s finished %d - 99th: %.02fms - 95th: %.02fms - avg: %.02fms",
            self.prefix,
            len(ordered),
            _percentile(99.0, ordered) * 1000,
            _percentile(95.0, ordered) * 1000,
            avg_ms,
        )


def destination_metrics(addresses: list[str], status_every: int) -> tuple[TimerMetrics, dict[str, TimerMetrics]]:
    """The ``[aggregate]:`` metrics and one per address (silent when there is only one address)."""
    every = status_every if len(addresses) > 1 else 0
    per_address = {address: TimerMetrics(every, f"[{address}]:") for address in addresses}
    return TimerMetrics(status_every, "[aggregate]:"), per_address
