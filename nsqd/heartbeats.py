"""Heartbeats: one task sends every connection's, instead of a sleeping task per connection.

nsqd runs a ticker per client (``heartbeatInterval``, 30 s by default, or what IDENTIFY asked for) and writes a
``_heartbeat_`` response at every tick. Here a task per connection slept for the interval; at 5,000 idle consumers
(167 heartbeats a second) each heartbeat's wake-up of its own task was a large part of what idle connections cost.
``HeartbeatTimer`` keeps one heap of (due time, client) entries and one task that sleeps until the earliest, then
writes the heartbeat of every client due by then and schedules its next one an interval after the previous due
time (a ticker, as nsqd's). Rescheduling (IDENTIFY changes the interval) and cancelling (the connection ends) only
replace or drop the client's entry in a dictionary; entries left in the heap are skipped when they come up, and
the heap is rebuilt without them once they outnumber the live ones (``STALE_MIN`` at least): a stale entry holds
its ended connection's objects (5 KB), and a flood of short connections would otherwise keep an interval's worth.
The heartbeats due within ``BATCH_WINDOW`` (0.1 s) of the earliest go out at the same wake-up, a little early (the
ticker keeps each client's own due times, so its period does not drift): 5,000 connections at 30 s make 10 wake-ups
a second instead of 167, and their answers (NOP) come back together to the read poller.
A heartbeat is written to the socket by the timer itself when the connection allows (plain TCP, its writer not
in the middle of a write: ``Client.write_frame_now``), so an idle connection's heartbeat wakes none of its tasks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:  # for annotations only
    from .client import Client

from protocol.frames import HEARTBEAT_FRAME

__all__ = ["BATCH_WINDOW", "STALE_MIN", "HeartbeatTimer"]

#: heartbeats due within this many seconds of a wake-up are written at that wake-up (nsqd's shortest interval is 1 s)
BATCH_WINDOW = 0.1
#: entries of ended or rescheduled connections kept in the heap before it is rebuilt without them (and no more
#: than the live entries): rebuilding costs one pass per as many ends as the heap holds
STALE_MIN = 64


class HeartbeatTimer:
    """Writes ``HEARTBEAT_FRAME`` to every scheduled client each interval (see the module notes)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Client]] = []
        self._current: dict[Client, tuple[int, float]] = {}  # client -> (its live entry's number, interval)
        self._numbers = itertools.count()
        self._wake = trio.Event()
        self._sleeping_until = math.inf
        self._stale = 0  # heap entries no longer live (skipped when they come up)
        self.sent = 0

    def __len__(self) -> int:
        return len(self._current)

    def schedule(self, client, interval: float) -> None:
        """(Re)start ``client``'s heartbeats: the first ``interval`` from now; none if ``interval <= 0``."""
        if interval <= 0:
            self.cancel(client)
            return
        number = next(self._numbers)
        if self._current.get(client) is not None:
            self._stale += 1
        self._current[client] = (number, interval)
        due = trio.current_time() + interval
        heapq.heappush(self._heap, (due, number, client))
        if due < self._sleeping_until:
            self._wake.set()

    def cancel(self, client) -> None:
        """No more heartbeats for ``client`` (its connection ended)."""
        if self._current.pop(client, None) is not None:
            self._stale += 1
            if self._stale >= STALE_MIN and self._stale > len(self._current):
                self._compact()

    def _compact(self) -> None:
        """Rebuild the heap (in place: ``run`` holds it) from its live entries only."""
        current = self._current
        heap = self._heap
        heap[:] = [entry for entry in heap if (live := current.get(entry[2])) is not None and live[0] == entry[1]]
        heapq.heapify(heap)
        self._stale = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        heap = self._heap
        current = self._current
        task_status.started()
        while True:
            self._sleeping_until = heap[0][0] if heap else math.inf
            with trio.move_on_at(self._sleeping_until):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            horizon = now + BATCH_WINDOW
            next_ticks = []
            while heap and heap[0][0] <= horizon:
                due, number, client = heapq.heappop(heap)
                live = current.get(client)
                if live is None or live[0] != number:
                    self._stale -= 1
                    continue  # cancelled, or rescheduled with a newer entry
                client.write_frame_now(HEARTBEAT_FRAME)
                self.sent += 1
                interval = live[1]
                following = due + interval
                if following <= now:  # the loop was held up past a whole interval: no burst of missed ticks
                    following = now + interval
                next_ticks.append((following, number, client))
            for entry in next_ticks:  # (after the loop: one heartbeat per client and wake-up, whatever its interval)
                heapq.heappush(heap, entry)
