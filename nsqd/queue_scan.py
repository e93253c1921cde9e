"""The queue scan loop: finds expired in-flight messages and due deferred messages, like nsqd's queueScanLoop.

Every channel has two time-ordered queues (in flight, deferred). Instead of a timer per message, one loop samples the
channels, as Redis samples keys with a TTL (its probabilistic expiration algorithm):

- Every ``interval`` (default 100 ms) it picks up to ``selection_count`` (default 20) distinct channels at random
  among the *active* ones and calls ``channel.process_queues(now)`` on each, ``now`` being ``trio.current_time()``.
  The channel moves what has expired or fallen due back to its queue and returns True if it moved anything
  ("dirty").
- Active: the channels that have something in flight or deferred (``has_timed_work()``). nsqd samples among all of
  its channels, so with 10,000 channels a given one is looked at every 50 s on average, and a timed-out or deferred
  message of a quiet channel waits that long; and most of the samples are spent on channels with nothing to do.
  Here a channel's queues tell the scanner (``activate``) when they go from empty to holding something, once per
  batch of the dispatcher at most, and a channel leaves the active set when a scan finds it with nothing timed
  left (checked right after its ``process_queues``, with no await in between, so no activation is lost). While
  ``selection_count`` or fewer are active, every one of them is processed at each tick, wherever it sits among
  the others. A refresh also adds the channels new to the list that already have timed work (pushed before their
  queues were wired to tell); the channels it knew were looked at when they were new, and tell from then on.
- If more than ``dirty_percent`` (default 25 %) of the sampled channels were dirty, it samples again at once without
  waiting for the next tick: many channels probably have work, so keep going until the sample looks clean.
- The cached list is refreshed every ``refresh_interval`` (default 5 s), and before the next sample after
  ``invalidate()`` (called when a channel is created or deleted: rebuilding the list of 20,000 channels at each
  of a burst of creates made each create cost milliseconds; nsqd itself waits for its refresh tick). At each refresh the
  worker pool is resized to ``clamp(int(0.25 * channels), 1, worker_pool_max)`` (default max 4).
- The pool: worker tasks in the scanner's nursery receive channels through a memory channel and answer dirty or
  not through another; the scanner sends a whole sample, then collects as many answers. Shrinking sends one close
  token per worker to stop; each token stops exactly one worker after the work queued before it, so no sample is
  left unanswered and at least one worker always remains. ``process_queues`` is synchronous, so in trio the pool
  spreads nothing over cores; it keeps nsqd's shape and lets a future ``process_queues`` await (disk) concurrently.

A message is therefore redelivered about ``interval`` after its deadline at worst while the sample covers all
channels; with more than ``selection_count`` channels, a clean channel may wait a few ticks.

No tick while nothing is active. nsqd wakes every ``interval`` whatever it holds; here a scanner with no active
channel and no ``invalidate()`` pending sleeps until the next refresh (only a refresh tick wakes it: 0.2 wake-ups
a second by default, against 10), and ``activate`` or ``invalidate`` move that sleep's end to the next tick of the
grid the ticks would have kept (``_tick_after``), without waking the task. So the first tick that sees a new
timed message comes when it would have come, and everything above holds whenever there is work; an idle node (or
an idle worker of a node with ``--workers``) does not wake for nothing.

An exception from ``process_queues`` propagates out of ``run`` and stops the scanner.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["QueueScanner", "QueueScannerStatistics"]


#: idle for more ticks than this, the scanner starts its grid anew rather than add up the ticks it skipped
_REGRID_AFTER = 10_000


class _Close:
    """The token that tells one pool worker to stop."""


_CLOSE = _Close()


@dataclass(frozen=True)
class QueueScannerStatistics:
    channels: int  # channels in the cached list
    pool_size: int  # workers the pool is sized to
    workers: int  # worker tasks alive right now (lags pool_size briefly after a resize)
    scans: int  # samples processed (a dirty loop counts each sample)
    ticks: int  # interval ticks that started a scan
    refreshes: int
    last_dirty_ratio: float  # dirty / sampled in the last sample; 0.0 before the first
    active: int = 0  # channels with something in flight or deferred, the only ones sampled
    idle: bool = False  # waiting for a channel with timed work (or a refresh), with no tick (see the notes)


class QueueScanner:
    """Samples channels at random and calls ``process_queues(now)`` on them; see the module docstring."""

    def __init__(
        self,
        get_channels: Callable[[], Sequence[Any]],
        *,
        interval: float = 0.1,
        refresh_interval: float = 5.0,
        selection_count: int = 20,
        worker_pool_max: int = 4,
        dirty_percent: float = 0.25,
        rng: random.Random | None = None,
        on_wake: Callable[[], None] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, not {interval}")
        if not refresh_interval > 0:
            raise ValueError(f"refresh_interval must be > 0, not {refresh_interval}")
        if selection_count < 1:
            raise ValueError(f"selection_count must be >= 1, not {selection_count}")
        if worker_pool_max < 1:
            raise ValueError(f"worker_pool_max must be >= 1, not {worker_pool_max}")
        if not 0 <= dirty_percent <= 1:
            raise ValueError(f"dirty_percent must be within [0, 1], not {dirty_percent}")
        self._get_channels = get_channels
        self.interval = interval
        self.refresh_interval = refresh_interval
        self.selection_count = selection_count
        self.worker_pool_max = worker_pool_max
        self.dirty_percent = dirty_percent
        self._rng = rng if rng is not None else random.Random()
        #: called when a channel's timed work ends an idle spell (nsqd notes it: ``nsqd/activity.py``)
        self._on_wake = on_wake
        self._channels: list[Any] = []
        self._active: dict[Any, None] = {}  # channels with timed work (insertion-ordered set; see the notes)
        self._pool_size = 0  # workers started minus close tokens sent; 0 while not running
        self._workers_alive = 0
        self._nursery: trio.Nursery | None = None
        self._work_send: trio.MemorySendChannel[Any] | None = None
        self._work_receive: trio.MemoryReceiveChannel[Any] | None = None
        self._done_send: trio.MemorySendChannel[bool] | None = None
        self._done_receive: trio.MemoryReceiveChannel[bool] | None = None
        self._scans = 0
        self._ticks = 0
        self._refreshes = 0
        self._last_dirty_ratio = 0.0
        self._stale = False  # invalidate() was called: refresh before the next sample
        self._next_scan = math.inf  # the next tick of the grid (run's clock)
        #: the idle sleep's scope while nothing is active (``activate`` and ``invalidate`` end it at the next tick)
        self._idle: trio.CancelScope | None = None

    def ideal_pool_size(self, channel_count: int) -> int:
        """nsqd's rule: a quarter of the channels, at least 1, at most ``worker_pool_max``."""
        return min(max(int(channel_count * 0.25), 1), self.worker_pool_max)

    def activate(self, channel: Any) -> None:
        """``channel`` holds messages in flight or deferred: it is sampled from the next tick on."""
        self._active[channel] = None
        if self._idle is not None:
            self._wake_at_next_tick()

    def invalidate(self) -> None:
        """The channels changed: reload the list before the next sample (once for any number of changes)."""
        self._stale = True
        if self._idle is not None:
            self._wake_at_next_tick()

    def refresh(self) -> None:
        """Reload the channel list now and resize the pool to match it."""
        self._stale = False
        channels = list(self._get_channels())
        active = self._active
        if channels != self._channels:  # (compared by identity first: well under a millisecond at 20,000)
            listed = set(channels)
            for channel in [channel for channel in active if channel not in listed]:  # deleted meanwhile
                del active[channel]
            # the channels new to the list, which may hold timed work from before their queues could tell; the
            # others were looked at by an earlier refresh and have told since (looking at all 20,000 every few
            # seconds was most of what an idle node did)
            known = set(self._channels)
            active.update(
                dict.fromkeys([channel for channel in channels if channel not in known and channel.has_timed_work()])
            )
        self._channels = channels
        self._refreshes += 1
        self.resize_pool(self.ideal_pool_size(len(self._channels)))

    def resize_pool(self, size: int) -> int:
        """Set the number of pool workers, clamped to ``[1, worker_pool_max]``; returns that size.

        The pool exists only while ``run`` runs (it starts sized by the channel count); otherwise this does nothing.
        """
        size = min(max(size, 1), self.worker_pool_max)
        if self._nursery is None:
            return size
        assert self._work_send is not None
        while self._pool_size < size:
            self._pool_size += 1
            self._nursery.start_soon(self._pool_worker, name="queue-scan-worker")
        while self._pool_size > size:
            self._pool_size -= 1
            self._work_send.send_nowait(_CLOSE)
        return size

    def statistics(self) -> QueueScannerStatistics:
        return QueueScannerStatistics(
            channels=len(self._channels),
            pool_size=self._pool_size,
            workers=self._workers_alive,
            scans=self._scans,
            ticks=self._ticks,
            refreshes=self._refreshes,
            last_dirty_ratio=self._last_dirty_ratio,
            active=len(self._active),
            idle=self._idle is not None,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the channel list, start the pool, then scan every ``interval`` until cancelled."""
        if self._nursery is not None:
            raise RuntimeError("QueueScanner.run is already running")
        work_send, work_receive = trio.open_memory_channel[Any](math.inf)
        done_send, done_receive = trio.open_memory_channel[bool](math.inf)
        self._work_send, self._work_receive = work_send, work_receive
        self._done_send, self._done_receive = done_send, done_receive
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.refresh()
                task_status.started()
                await self._loop()
        finally:
            self._nursery = None
            self._pool_size = 0

    # ---- internals --------------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        now = trio.current_time()
        self._next_scan = now + self.interval
        next_refresh = now + self.refresh_interval
        try:
            while True:
                if self._active or self._stale:
                    await trio.sleep_until(min(self._next_scan, next_refresh))
                else:
                    await self._sleep_idle(next_refresh)
                now = trio.current_time()
                if now >= next_refresh:
                    # Like nsqd, a refresh tick does not scan; a scan tick due now runs on the next pass at once.
                    self.refresh()
                    next_refresh = _next_tick(next_refresh, self.refresh_interval, now)
                    continue
                if now >= self._next_scan:
                    self._next_scan = _next_tick(self._next_scan, self.interval, now)
                    if self._stale:
                        self.refresh()
                    if self._active:
                        self._ticks += 1
                        await self._scan()
        finally:
            self._idle = None

    async def _sleep_idle(self, until: float) -> None:
        """Nothing active: sleep until ``until`` (the refresh), or the tick after an ``activate``/``invalidate``."""
        with trio.CancelScope(deadline=until) as idle:
            self._idle = idle
            try:
                await trio.sleep_forever()
            finally:
                self._idle = None
        if idle.deadline == until:  # the refresh came first: the grid's ticks since were skipped
            self._next_scan = self._tick_after(trio.current_time())

    def _wake_at_next_tick(self) -> None:
        """End the idle sleep at the grid's next tick (a deadline moved: the task is not woken before it)."""
        idle = self._idle
        assert idle is not None
        self._idle = None
        tick = self._next_scan = self._tick_after(trio.current_time())
        if tick < idle.deadline:
            idle.deadline = tick
        if self._on_wake is not None:
            self._on_wake()

    def _tick_after(self, now: float) -> float:
        """The first tick after ``now`` of the grid the ticks kept before the scanner went idle (added up as they
        are, so the same instants); after a long idle, a new grid from ``now``."""
        tick = self._next_scan
        interval = self.interval
        if now - tick > _REGRID_AFTER * interval:
            return now + interval
        while tick < now:
            tick += interval
        return tick

    async def _scan(self) -> None:
        assert self._work_send is not None and self._done_receive is not None
        while True:
            # Re-read the list on every pass so that a refresh() during a dirty loop takes effect at once.
            if self._stale:
                self.refresh()
            active = self._active
            if len(active) <= self.selection_count:
                sample = list(active)
            else:
                sample = self._rng.sample(list(active), self.selection_count)
            count = len(sample)
            if count == 0:
                return
            for channel in sample:
                self._work_send.send_nowait(channel)
            dirty = 0
            for _ in range(count):
                if await self._done_receive.receive():
                    dirty += 1
            self._scans += 1
            ratio = dirty / count
            self._last_dirty_ratio = ratio
            if ratio <= self.dirty_percent:
                return

    async def _pool_worker(self) -> None:
        self._workers_alive += 1
        try:
            work_receive = self._work_receive
            done_send = self._done_send
            active = self._active
            assert work_receive is not None and done_send is not None
            while True:
                channel = await work_receive.receive()
                if channel is _CLOSE:
                    return
                dirty = bool(channel.process_queues(trio.current_time()))
                if not channel.has_timed_work():  # no await since the scan: an activation cannot be missed
                    active.pop(channel, None)
                done_send.send_nowait(dirty)
        finally:
            self._workers_alive -= 1


def _next_tick(tick: float, period: float, now: float) -> float:
    """The tick after ``tick``; ticks missed while a scan ran long are skipped rather than run back to back."""
    tick += period
    if tick <= now:
        tick = now + period
    return tick
