"""ReadPoller: one task that reads every idle plain-TCP connection.

Why it exists: under trio, each read of a connection task is ``wait_readable(fd)``: trio registers the fd
one-shot, so every wait re-arms it with an ``epoll_ctl``, and every wake-up goes through the run queue, an
``Outcome`` and a coroutine switch of the connection's task. A producer that sends one PUB per round trip
pays all of that per message. Measured here (bench/HISTORY.md, change 14): a bare trio server answering one
frame per read cost 13-15 us of CPU per round trip with a task per connection, 7-8 us with one poller.

How: the poller keeps its own ``select.epoll`` set, where a connection is registered once
(level-triggered) for as long as it stays, and waits in trio for that one descriptor. When it is readable,
one step of the poller reads every ready connection and calls its ``poll_ready()``, which runs the commands
that need no await right there (``Connection.poll_ready``).

A connection is here only while its own task has nothing else to do: plain socket, waiting for input. It
leaves, and its task takes over again, on EOF, a read error, a command that must await (IDENTIFY, AUTH, an
auth refresh), a fatal error, or when the task is cancelled (read deadline, shutdown, a failed write). A
connection that leaves is unregistered at once, in the same step, so the poller never reads past a command
that its task has not run yet.

Level-triggered on purpose: a connection with more than one read's worth of input is simply reported again
by the next poll, after every other ready connection had its turn.

Small reads first, producers before consumers. Each member tells the size of its last read (``last_read``) and
its place in the daemon's fair order (``poll_actor``: a consumer's channel actor, ranked by its vruntime in the
actor system; None for any other connection, ranked -inf). The ready members whose last read was at most
``light_read`` bytes (a producer of single messages, a consumer's few FINs) are served first in a step, by rank
and then smallest first, and also from inside a busy channel's slice (``poll_light``, the actor system's
interlude hook): their input is cheap to handle and is what a message's latency waits on, while the others
(MPUB batches, bursts of FINs) wait for the poller's own step. A member whose next read turns out big is served
late from then on, and the other way round. An interlude passes the paused channel's vruntime (``below``) and
serves only the light members ranked before it: producers, and consumers of channels owed run time. The paused
channel's own consumers, and those of channels at or behind it, wait for the step: their FINs are that
channel's work, and while they wait the channel runs out of credit, ends its slice and lets the step come.

A fresh look after a long call. Serving one member can take a while (a burst of a hundred FINs, an MPUB batch,
a delivery it starts); a small read that arrives meanwhile would wait for the rest of the list. So once a call
took longer than ``repoll_after`` (20 us), the set is polled again and the light members that became ready and
were not served in this step yet are served next (by rank and size), before the rest of the list. The look
waits while the list goes on with light producers: nothing that arrives can rank before them (a look would only
reorder producers by size), so a step of single-PUB producers, each call longer than 20 us on a slow core,
looks again once at their end instead of after each (an ``epoll`` and a sort per PUB, 15% of the PUB
scenario's time). Each member is still called at most once per step, except those added with ``again``: a
replication peer's ACKs (``replication/sender.py``), a few bytes that the OKs of every MPUB in the step wait
on; a cheap call costs no extra ``epoll``.

One read for the producers. The light producers ready at the start of a step (their place in the list) are
read together: when the daemon set ``step_poll``, the step's poll itself is nsqd's ``PublishBatch.poll_producers``,
one C call that polls the set and reads, among the ready members, the light producers that publish one message
at a time (``nsqd/fastpath.py``), and hands back the other events for the order below; the producers it could
not take (something to check first) are among them, first in the list, for their ``poll_ready``. Without
``step_poll``, and in an interlude, the light producers at the head of the list go to
``bulk_read`` (``PublishBatch.read_producers``) the same way. That saves the interpreter's round per connection
(the call, its checks, a 64 KiB buffer per read) that a step of ten PUBs paid ten times (bench/HISTORY.md, items
26 and 30).

Answers at the end of the light part of a step. A member that answers during a step (an OK in its output
buffer) asks for the write with ``defer_reply``: the writes of every light member served are made after the
last of them was read, before the first heavy member is served (or at the step's end), and the PUBs of plain
producers are published there too, once per topic (``nsqd/fastpath.py``). Reading all the ready producers before
waking any of them with an answer halves the context switches of a PUB round trip when nsqd and its producers
share the cores (bench/HISTORY.md, change 23); a heavy member's answer still leaves before the next heavy
member's work, so an MPUB producer's next batch is on its way while the others are handled.

Several steps per wake-up. A step ends with the answers written; by then other producers (answered in the step
before) have often sent their next PUB. Going back to trio to learn that costs a round per step: the re-arm of
the poller's descriptor (an ``epoll_ctl``), trio's own ``epoll_wait``, the run queue, an ``Outcome`` and the task
switch, about 8 us of CPU (bench/HISTORY.md, item 25), where a poll of the poller's own set costs under 1 us. So
after a step that served something, and only light members (producers of single messages, consumers' few FINs:
a step with an MPUB batch or a burst of FINs is followed by trio's round, as before, so that the channels'
deliveries keep pace with bulk publishers), ``run`` polls its set again and serves another step, as long as
trio has nothing else to do: no task ready to run (a woken connection task, a writer, the dispatcher, anything
a step woke) and no deadline due (timers, read deadlines), checked before each further step
(``scheduler_idle``). The wake-up ends at the first poll that finds nothing, or once ``wake_budget`` (500 us)
has passed since its first step: what only trio's own ``epoll_wait`` can see (a new connection, an HTTP
request, a TLS connection's input, a thread's ``run_sync_soon``) waits at most that long behind a busy poller,
and only while no task is ready. So does a task that was already ready when trio's round began and comes after
the poller in that round: trio takes the round's tasks out of its run queue before running them, so no one can
see it waiting. Measured with ``bench pub`` (bench/HISTORY.md, items 27-28).
"""

from __future__ import annotations

import math
import select
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

__all__ = ["ReadPoller"]


def _never() -> float:
    return math.inf


def scheduler_idle():
    """``idle(now)``: True while trio has no task ready to run and no deadline due at ``now`` (its run clock).

    Asked once per extra step of a wake-up (see "Several steps per wake-up"), so it must be cheap: it reads the
    run queue and the deadline heap of trio's runner directly. ``trio.lowlevel.current_statistics()`` says the
    same but counts every descriptor trio waits on each time; it is the fallback for a trio whose internals
    differ."""
    try:
        runner = trio._core._run.GLOBAL_RUN_CONTEXT.runner
        runq = runner.runq
        next_deadline = runner.deadlines.next_deadline
        len(runq)
    except (AttributeError, TypeError):
        statistics = trio.lowlevel.current_statistics
        clock = trio.current_time

        def idle_by_statistics(now: float) -> bool:
            stats = statistics()
            return not stats.tasks_runnable and clock() + stats.seconds_to_next_deadline > now

        return idle_by_statistics

    def idle(now: float) -> bool:
        return not runq and next_deadline() > now

    return idle


class Polled(Protocol):
    #: bytes of its last read: the smaller, the sooner it is served (see "Small reads first")
    last_read: int
    #: the actor whose vruntime is its place in the fair order, before size (None: before every actor; see
    #: "Small reads first")
    poll_actor: Any

    def poll_ready(self) -> None:
        """Read and handle what arrived; must not raise (errors go back to the connection's task)."""


class ReadPoller:
    """The set of idle plain connections and the task that reads them (``run``)."""

    def __init__(self, light_read: int = 2048, repoll_after: float = 20e-6, wake_budget: float = 500e-6) -> None:
        self.light_read = light_read
        self.repoll_after = repoll_after
        self._epoll = select.epoll()
        self._members: dict[int, Polled] = {}
        self._again: set[int] = set()  # members a fresh look may serve again in the same step
        self._polling = False
        self._replies: list = []  # members whose answers wait for the end of the step (``defer_reply``)
        self._step_end: list[Callable[[], None]] = []  # called once the step's answers are sent (``at_step_end``)
        #: the run's clock at the start of the current step (``run`` sets the clock; before it, +inf): members
        #: read it instead of the clock, once per step rather than once per member
        self.step_time = math.inf
        self._now = _never
        #: reads the light producers ready at the start of a step together (``PublishBatch.read_producers``):
        #: ``bulk_read(fds, members)`` returns the descriptors it left to their members' ``poll_ready``
        self.bulk_read: Callable[[list[int], dict[int, Any]], list[int]] | None = None
        #: polls the set at the start of a step and reads the light producers it finds with the same call
        #: (``PublishBatch.poll_producers``): ``step_poll(epoll, members, light_read)`` returns the other events
        #: and the descriptors it read; None: ``epoll.poll`` (see "One read for the producers")
        self.step_poll: Callable[[Any, dict[int, Any], int], tuple[list[Any], list[int]]] | None = None
        #: how long one wake-up may go on serving steps while trio has nothing else to run (seconds from the
        #: start of its first step; 0: one step per wake-up); see "Several steps per wake-up"
        self.wake_budget = wake_budget
        #: the last step served a member whose last read was big (an MPUB batch, a burst of FINs): it ends the
        #: wake-up (see "Several steps per wake-up")
        self.heavy_step = False
        #: noted at each wake-up while someone watches it (``nsqd/activity.py``: the loops an idle node lets sleep)
        self.activity: Any = None

    def __len__(self) -> int:
        return len(self._members)

    def members(self) -> list[Polled]:
        """The members watched now."""
        return list(self._members.values())

    def add(self, fd: int, member: Polled, *, again: bool = False) -> None:
        """Watch ``fd`` until ``discard``; ``member.poll_ready()`` is called whenever it is readable (``again``:
        also more than once in a step, by a fresh look; for a cheap member that others wait on)."""
        assert fd not in self._members, "a descriptor is added once"
        self._epoll.register(fd, select.EPOLLIN)
        self._members[fd] = member
        if again:
            self._again.add(fd)

    def discard(self, fd: int) -> None:
        """Stop watching ``fd`` (no-op if it is not watched). Call it before the descriptor is closed."""
        self._again.discard(fd)
        if self._members.pop(fd, None) is not None:
            try:  # noqa: SIM105 - the poller's path: try costs nothing unless raised, suppress() is a call
                self._epoll.unregister(fd)
            except (OSError, ValueError):  # already closed: the kernel dropped it from the set
                pass

    def poll_once(self) -> int:
        """Hand every ready descriptor to its member, small reads first; returns how many were ready."""
        self._polling = True
        self.step_time = self._now()
        try:
            if self.step_poll is None:
                events = self._epoll.poll(0)
                taken: tuple[int, ...] | list[int] = ()
                stale = False
            else:
                before = time.perf_counter()
                events, taken = self.step_poll(self._epoll, self._members, self.light_read)
                # longer than as many calls: the producers' reads count as members' calls (see "A fresh look")
                stale = time.perf_counter() - before > self.repoll_after * (len(taken) or 1)
            if events:
                light, heavy, producers = self._sort(events)
                self.heavy_step = bool(heavy)
                # one list: a fresh look skips whatever this step has served
                self._serve(
                    light + heavy,
                    producers,
                    served=set(taken),
                    stale=stale,
                    producers_offered=self.step_poll is not None,
                )
            else:  # the producers read were all there was
                self.heavy_step = False
        finally:
            if self._replies:  # the step's answers, without ``_end_step``'s loop when nothing waits at its end
                self._send_replies()
            if self._step_end:
                self._end_step()
            self._polling = False
        return len(events) + len(taken)

    def defer_reply(self, member) -> bool:
        """Inside a step: have ``member.send_deferred()`` called at its end, after every ready member was read,
        and return True; outside one, False (the caller writes at once)."""
        if not self._polling:
            return False
        self._replies.append(member)
        return True

    def at_step_end(self, callback: Callable[[], None]) -> bool:
        """Inside a step: have ``callback()`` called at its very end, after every member was served and every
        deferred answer sent (a heavy member's too), and return True; outside one, False (the caller acts at
        once). Durable mode's group commit of the publishes that came over the workers' links
        (``WorkerMesh.handle_batch``) waits there, so that one fsync covers them and the step's own publishes."""
        if not self._polling:
            return False
        self._step_end.append(callback)
        return True

    def _end_step(self) -> None:
        """The deferred answers, then the ``at_step_end`` calls, and again whatever those deferred."""
        while True:
            if self._replies:
                self._send_replies()
            if not self._step_end:
                return
            callbacks, self._step_end = self._step_end, []
            for callback in callbacks:
                callback()

    def _send_replies(self) -> None:
        """The step's end: every deferred answer, still inside the step (an interlude cannot start a step here),
        including any deferred meanwhile (a publish that delivers to a consumer may answer it)."""
        while self._replies:
            replies, self._replies = self._replies, []
            for member in replies:
                member.send_deferred()

    def poll_light(self, below: float = math.inf) -> None:
        """Serve only the ready members whose last read was small and whose rank is below ``below``; the others
        wait for the next ``poll_once``.
        Called from inside long work (a channel's slice); does nothing inside a step already in progress, or
        once ``run`` has ended (a slice may still run during a shutdown)."""
        if self._polling or self._epoll.closed:
            return
        self._polling = True
        self.step_time = self._now()
        try:
            light, _, producers = self._sort(self._epoll.poll(0), below)
            if light:
                self._serve(light, producers, below)
        finally:
            if self._replies or self._step_end:
                self._end_step()
            self._polling = False

    def _sort(self, events: list[tuple[int, int]], below: float = math.inf) -> tuple[list[int], list[int], int]:
        """The ready descriptors whose last read was at most ``light_read`` bytes and whose rank is below
        ``below``, by rank and then smallest first; the heavy ones in the order they came; and how many of the
        light ones are producers (they come first). Light members ranked at or above ``below`` are left out:
        still readable, they are reported again by a later poll."""
        members = self._members
        limit = self.light_read
        first = -math.inf
        light = []
        heavy = []
        producers = 0
        for fd, _ in events:
            member = members.get(fd)
            if member is not None:
                size = member.last_read
                if size <= limit:
                    actor = member.poll_actor
                    if actor is None:
                        light.append((first, size, fd))
                        producers += 1
                    else:
                        rank = actor.vruntime
                        if rank < below:
                            light.append((rank, size, fd))
                else:
                    heavy.append(fd)
        light.sort()
        return [entry[2] for entry in light], heavy, producers

    def _serve(
        self,
        fds: list[int],
        producers: int,
        below: float = math.inf,
        *,
        served: set[int] | None = None,
        stale: bool = False,
        producers_offered: bool = False,
    ) -> None:
        """Call the members of ``fds`` (its first ``producers`` light producers) in order, each once. After a
        call that took longer than ``repoll_after``, once the list reaches a member that is not a light
        producer (or its end), the light members that became ready meanwhile and were not served yet go first
        (see "A fresh look"). ``served``: members read already in this step (``step_poll``), ``stale``: that read
        ran long; ``producers_offered``: the light producers of ``fds`` are those ``step_poll`` left (something to
        check first), so they go to their ``poll_ready`` without being offered to ``bulk_read`` again."""
        members = self._members
        repoll_after = self.repoll_after
        clock = time.perf_counter
        if served is None:
            served = set()
        index = 0
        before = clock()  # one clock call per member: the end of a call is the start of the next
        if producers and self.bulk_read is not None and not producers_offered:
            # the light producers in one go (see "One read for the producers"); the fresh look skips them all
            head = fds[:producers]
            served.update(head)
            rest = self.bulk_read(head, members)
            fds = rest + fds[producers:]
            after = clock()
            if after - before > repoll_after * (producers - len(rest) or 1):  # longer than as many calls
                stale = True
            producers = len(rest)
            before = after
        while True:
            if stale and index >= producers:
                stale = False
                served.update(fds[:index])
                if self._again:
                    served -= self._again
                light, _, fresh_producers = self._sort(self._epoll.poll(0), below)
                fresh = [fd for fd in light if fd not in served]
                if fresh:
                    # the list has no producer left: the fresh ones (producers first) go before the rest
                    producers = len([fd for fd in light[:fresh_producers] if fd not in served])
                    moved = set(fresh)  # a set: thousands of members ready at once made this quadratic
                    fds = fresh + [fd for fd in fds[index:] if fd not in moved]
                    index = 0
                before = clock()  # the look's own time is no member's
            if index >= len(fds):
                return
            fd = fds[index]
            index += 1
            member = members.get(fd)  # None: it left (or was replaced) earlier in this same step
            if member is None:
                continue
            if self._replies and member.last_read > self.light_read:
                # the light members' answers leave before a heavy member's work (an MPUB batch, a burst of FINs)
                self._send_replies()
                before = clock()
            member.poll_ready()
            after = clock()
            if after - before > repoll_after:
                stale = True
            before = after

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Wait for the set to have input, then serve it, until cancelled; closes the epoll set at the end."""
        epoll_fd = self._epoll.fileno()
        self._now = trio.lowlevel.current_clock().current_time
        task_status.started()
        idle = scheduler_idle()
        activity = self.activity
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll_fd)
                if activity is not None and activity.pending is not None:
                    activity.note()
                if self.poll_once() and self.wake_budget > 0:
                    # more steps in this wake-up while nothing else waits (see "Several steps per wake-up")
                    woke = self.step_time
                    while (
                        not self.heavy_step
                        and idle(self.step_time)
                        and self.step_time - woke < self.wake_budget
                        and self.poll_once()
                    ):
                        pass
        finally:
            self._members.clear()
            trio.lowlevel.notify_closing(epoll_fd)
            self._epoll.close()
