"""Activity: what wakes the periodic loops that an idle node lets sleep.

nsqd's loops wake on a timer whatever the node holds: the queue scan every 100 ms, the sync loop every second. An
idle trionsq node did the same, about fifteen wake-ups a second (4.5 ms of CPU a second), and with ``--workers``
every worker did, even one whose topics are quiet while another worker's are busy: each wake-up of a process on
a core that the busy worker or its clients wanted. So the loops whose work only activity makes sleep once a pass
found nothing to do, until the next sign of activity:

- the sync loop (``NSQD._sync_loop``): the fsyncs of disk queues (a queue with changes tells it, through
  ``NSQD.active_queues``), the copies durable mode kept in memory (``NSQD.owing_topics``), and the C heap's
  release (``runtime/allocator.py``), which has something to give back only after work freed memory;
- a worker's load report (``WorkerMesh._report_load``): a worker that did nothing for a whole interval is not
  busy, and stays so until something happens;
- the queue scan has its own rule (``queue_scan.py``: no tick while no channel holds timed work).

The signs (``Activity.note``): the read poller waking up (plain TCP clients), a channel whose queues start holding
something in flight or deferred (any delivery, TLS and compressed clients' too), a disk queue that changed, a
durable topic that owes a record, a topic, channel or connection let go (memory freed). Noting costs a test of
one attribute while nobody waits; the loops ask for a fresh ``watch`` at each pass, so a busy node sets one event
per loop and pass. Work that notes nothing for a while (a TLS consumer whose channel always has messages in
flight, HTTP publishes) still shows in the process's CPU time: a loop sleeps only after a pass with no note and
less than ``IDLE_SHARE`` of a core used since the one before.
"""

from __future__ import annotations

import time
from typing import Any

import trio

__all__ = ["IDLE_SHARE", "Activity", "NotingDict", "cpu_share"]

#: a process that used less than this share of a core over a loop's period, and noted nothing, is idle (an idle
#: node's own timers take under 0.1% of a core)
IDLE_SHARE = 0.01


def cpu_share(since: tuple[float, float]) -> tuple[float, tuple[float, float]]:
    """The share of a core this process used since ``since`` (a previous call's second value, or ``(0, 0)``), and
    the mark to pass next time."""
    mark = (time.process_time(), time.monotonic())
    return (mark[0] - since[0]) / max(mark[1] - since[1], 1e-3), mark


class Activity:
    """A latch: ``watch()`` gives an event that the next ``note()`` sets (one event for every watcher meanwhile)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        #: the event the next ``note`` sets; None while nobody watches (then ``note`` does nothing)
        self.pending: trio.Event | None = None

    def note(self) -> None:
        """Something happened: wake whoever watches."""
        pending = self.pending
        if pending is not None:
            self.pending = None
            pending.set()

    def watch(self) -> trio.Event:
        """An event set at the next ``note``: wait on it while idle, or look later whether anything happened."""
        pending = self.pending
        if pending is None:
            pending = self.pending = trio.Event()
        return pending


class NotingDict(dict):
    """A dict used as an ordered set that notes ``activity`` on each insertion (the daemon's sets of queues that
    owe a sync, of topics that owe records: their owners insert once per change from nothing owed)."""

    __slots__ = ("activity",)

    def __init__(self, activity: Activity) -> None:
        super().__init__()
        self.activity = activity

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self.activity.note()
