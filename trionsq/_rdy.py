"""The consumer's flow control: how much RDY each nsqd connection gets, and backoff after failures.

Sans-IO and clock-free: every input takes ``now`` (seconds on any monotonic clock) and returns the RDY commands to
send as ``[(connection key, count), ...]``; ``next_deadline()`` says when ``tick(now)`` wants to run next. The trio
consumer feeds it, and the tests drive it with plain numbers. The semantics are go-nsq's (consumer.go), which
pynsq's reader shares in substance:

Spreading ``max_in_flight``
    RDY is a standing window in NSQ >= 0.2.29 (nsqd sends while ``in_flight < rdy``), so it changes only when the
    distribution changes. With ``n`` connections each gets ``max(1, max_in_flight // n)``, never above the nsqd's
    ``max_rdy_count`` and never so much that the sum passes ``max_in_flight`` (a connection that would is truncated,
    or left at 0). A joining connection first lowers the others' RDY, then takes its share; one that leaves gives its
    share back to the rest (go-nsq only re-spreads on the next join; handing the share back at once keeps a consumer
    that lost an nsqd at full speed).

More connections than ``max_in_flight``
    Only ``max_in_flight`` connections can hold RDY 1. Every ``redistribute_interval`` (go-nsq's 5 s) a connection
    that received nothing for ``low_rdy_idle_timeout`` (10 s), or has held its RDY for ``low_rdy_timeout`` (30 s),
    drops to RDY 0, and the free slots go to the connections that have waited longest: RDY 1 rotates round them
    all, and an nsqd with messages is never starved for long by idle ones.

Backoff
    A handler failure (REQ with backoff) raises the backoff level by one, as long as the next duration,
    ``backoff_multiplier * 2**level`` seconds (``backoff_strategy="exponential"``) or a random time below it
    (``"full_jitter"``, go-nsq's FullJitterStrategy), does not pass ``max_backoff_duration`` (0 disables backoff);
    a success (FIN) lowers it by one; a REQ without backoff leaves it. After any such signal, a level above 0 means
    RDY 0 on every connection for the level's duration (drawn anew with full jitter; at most
    ``max_backoff_duration``); when that time is up one connection picked at random gets RDY 1 as a trial, whose
    outcome is the next signal. Signals that arrive while the RDY-0 period runs are ignored, so a burst of failures
    of messages already in flight costs one level, not a hundred. Reaching level 0 through a success gives every
    connection its full share again. While the level is above 0 at most one RDY 1 is out, moved by the
    redistribution above when its connection idles or goes.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["ReadyController", "ReadyStats"]

K = TypeVar("K", bound=Hashable)
Updates = list[tuple[K, int]]

REDISTRIBUTE_INTERVAL = 5.0  # go-nsq's rdy_redistribute_interval default
LOW_RDY_TIMEOUT = 30.0  # go-nsq's low_rdy_timeout default
BACKOFF_STRATEGIES = ("exponential", "full_jitter")
RESUME_RETRY = 1.0  # go-nsq waits a second when a trial RDY 1 finds no connection


@dataclass(slots=True)
class _Conn:
    max_rdy: int
    rdy: int = 0
    last_message_at: float = 0.0
    last_rdy_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ReadyStats:
    connections: int
    total_rdy: int
    max_in_flight: int
    backoff_level: int
    backing_off: bool  # inside a RDY-0 period


class ReadyController(Generic[K]):
    """RDY counts and backoff for one consumer's connections (see the module's notes)."""

    def __init__(
        self,
        *,
        max_in_flight: int,
        backoff_multiplier: float = 1.0,
        max_backoff_duration: float = 120.0,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = LOW_RDY_TIMEOUT,
        redistribute_interval: float = REDISTRIBUTE_INTERVAL,
        backoff_strategy: str = "exponential",
        now: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0, not {max_in_flight}")
        if backoff_strategy not in BACKOFF_STRATEGIES:
            raise ValueError(
                f"backoff_strategy must be one of {', '.join(BACKOFF_STRATEGIES)}, not {backoff_strategy!r}"
            )
        self.backoff_strategy = backoff_strategy
        self.max_in_flight = max_in_flight
        self.backoff_multiplier = backoff_multiplier
        self.max_backoff_duration = max_backoff_duration
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.low_rdy_timeout = low_rdy_timeout
        self.redistribute_interval = redistribute_interval
        self._rng = rng or random.Random()
        self._conns: dict[K, _Conn] = {}
        self._total = 0  # sum of the RDY counts sent
        self.backoff_level = 0
        self._backoff_until: float | None = None  # end of the current RDY-0 period
        self._next_redistribute = now + redistribute_interval
        self._redistribute = False  # a connection lost or could not get its RDY: hand out the free slots
        self._stopped = False

    # --- inspection -------------------------------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._conns

    def rdy(self, key: K) -> int:
        return self._conns[key].rdy

    @property
    def total_rdy(self) -> int:
        return self._total

    @property
    def backing_off(self) -> bool:
        return self._backoff_until is not None

    @property
    def backoff_until(self) -> float | None:
        """The end of the current RDY-0 period, or None outside one."""
        return self._backoff_until

    def stats(self) -> ReadyStats:
        return ReadyStats(len(self._conns), self._total, self.max_in_flight, self.backoff_level, self.backing_off)

    def per_connection(self) -> int:
        """Each connection's share: ``max(1, max_in_flight // n)``, and 0 when max_in_flight is 0."""
        if not self._conns:
            return self.max_in_flight
        return min(max(1, self.max_in_flight // len(self._conns)), self.max_in_flight)

    def next_deadline(self) -> float:
        """When ``tick`` has work: the end of the RDY-0 period or the next redistribution."""
        if self._backoff_until is not None:
            return min(self._backoff_until, self._next_redistribute)
        return self._next_redistribute

    # --- inputs -----------------------------------------------------------------------------------------------------
    def add(self, key: K, max_rdy: int, now: float) -> Updates[K]:
        """A subscribed connection whose nsqd allows ``max_rdy``; it starts at RDY 0."""
        assert key not in self._conns, key
        self._conns[key] = _Conn(max_rdy=max(0, max_rdy), last_message_at=now, last_rdy_at=now)
        if self._stopped or self.backoff_level or self.backing_off:
            return []
        updates: Updates[K] = []
        share = self.per_connection()
        for other in self._conns:  # lower the others first so the newcomer's share fits under max_in_flight
            if other != key:
                self._set(other, share, now, updates)
        self._set(key, share, now, updates)
        return updates

    def remove(self, key: K, now: float) -> Updates[K]:
        """A connection that closed: its RDY is free again."""
        conn = self._conns.pop(key)
        self._total -= conn.rdy
        if self._stopped or not self._conns:
            return []
        if self.backoff_level or self.backing_off or len(self._conns) >= self.max_in_flight:
            if conn.rdy:
                self._redistribute = True
            return []
        updates: Updates[K] = []
        share = self.per_connection()
        for other in self._conns:
            self._set(other, share, now, updates)
        return updates

    def message_received(self, key: K, now: float) -> None:
        conn = self._conns.get(key)
        if conn is not None:
            conn.last_message_at = now

    def succeeded(self, now: float) -> Updates[K]:
        """A message FIN'd: one backoff level less."""
        if self._stopped or self.backing_off or self.backoff_level == 0:
            return []
        self.backoff_level -= 1
        return self._after_signal(now, changed=True)

    def failed(self, now: float, *, backoff: bool = True) -> Updates[K]:
        """A message REQ'd: one backoff level more (with ``backoff``), or the current level again."""
        if self._stopped or self.backing_off:
            return []
        changed = False
        if backoff and self._duration(self.backoff_level + 1) <= self.max_backoff_duration:
            self.backoff_level += 1
            changed = True
        return self._after_signal(now, changed=changed)

    def set_max_in_flight(self, max_in_flight: int, now: float) -> Updates[K]:
        """A new ``max_in_flight`` (0 pauses); every connection gets its new share unless backing off."""
        if max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        if self._stopped or self.backoff_level or self.backing_off:
            return []
        updates: Updates[K] = []
        share = self.per_connection()
        lower = [key for key, conn in self._conns.items() if conn.rdy > share]
        for key in lower + [key for key in self._conns if key not in lower]:
            self._set(key, share, now, updates)
        return updates

    def tick(self, now: float) -> Updates[K]:
        """Run the timers that are due: the end of a RDY-0 period, the periodic redistribution."""
        updates: Updates[K] = []
        if self._stopped:
            return updates
        if self._backoff_until is not None and now >= self._backoff_until:
            self._resume(now, updates)
        if now >= self._next_redistribute:
            self._next_redistribute = now + self.redistribute_interval
            self._redistribute_rdy(now, updates)
        return updates

    def stop(self, now: float) -> Updates[K]:
        """RDY 0 on every connection, and nothing more from here on."""
        updates: Updates[K] = []
        for key in self._conns:
            self._set(key, 0, now, updates)
        self._stopped = True
        self._backoff_until = None
        return updates

    # --- the machinery ----------------------------------------------------------------------------------------------
    def _duration(self, level: int) -> float:
        """The backoff time of ``level``: exponential, or uniform below it with full jitter (drawn anew at
        each call, as go-nsq's strategy is asked both to decide the level and to time the RDY-0 period)."""
        duration: float = self.backoff_multiplier * 2**level
        if self.backoff_strategy == "full_jitter":
            return self._rng.random() * duration
        return duration

    def _after_signal(self, now: float, *, changed: bool) -> Updates[K]:
        updates: Updates[K] = []
        if self.backoff_level == 0:
            if changed:  # out of backoff: everyone's full share again
                share = self.per_connection()
                for key in self._conns:
                    self._set(key, share, now, updates)
            return updates
        for key in self._conns:
            self._set(key, 0, now, updates)
        self._backoff_until = now + min(self._duration(self.backoff_level), self.max_backoff_duration)
        return updates

    def _resume(self, now: float, updates: Updates[K]) -> None:
        """The RDY-0 period is over: one connection, picked at random, tries one message."""
        if not self._conns:
            self._backoff_until = now + RESUME_RETRY
            return
        self._backoff_until = None
        key = self._rng.choice(list(self._conns))
        self._set(key, 1, now, updates)

    def _redistribute_rdy(self, now: float, updates: Updates[K]) -> None:
        if self.backing_off or not self._conns:
            return
        if len(self._conns) > self.max_in_flight or (self.backoff_level and len(self._conns) > 1):
            self._redistribute = True
        if not self._redistribute:
            return
        self._redistribute = False
        waiting = [key for key, conn in self._conns.items() if conn.rdy == 0]
        released = []
        for key, conn in self._conns.items():
            if conn.rdy and (
                now - conn.last_message_at > self.low_rdy_idle_timeout or now - conn.last_rdy_at > self.low_rdy_timeout
            ):
                self._set(key, 0, now, updates)
                released.append(key)
        # those that waited longest come first (ties at random), then the ones just released: a released RDY
        # really moves, and it goes round all the connections (go-nsq picks among all of them at random)
        self._rng.shuffle(waiting)
        waiting.sort(key=lambda key: self._conns[key].last_rdy_at)
        self._rng.shuffle(released)
        available = (1 if self.backoff_level else self.max_in_flight) - self._total
        for key in (waiting + released)[: max(0, available)]:
            self._set(key, 1, now, updates)

    def _set(self, key: K, count: int, now: float, updates: Updates[K]) -> None:
        """Give ``key`` RDY ``count``, truncated to its nsqd's max and to what max_in_flight leaves free."""
        conn = self._conns[key]
        count = min(count, conn.max_rdy)
        if count > conn.rdy:  # lowering always fits; raising only into what the others leave free
            free = self.max_in_flight - self._total + conn.rdy
            if free <= 0:
                if conn.rdy == 0:
                    self._redistribute = True  # go-nsq retries such a connection later; the redistribution will
                return
            count = min(count, free)
        if count == conn.rdy:
            return
        self._total += count - conn.rdy
        conn.rdy = count
        conn.last_rdy_at = now
        updates.append((key, count))
        assert self._total >= 0, self._total
