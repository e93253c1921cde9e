"""A fair scheduler for actors: many units of work shared out among a few worker tasks by run time.

An *actor* is anything that has work now and then (in nsqd, one per channel: moving messages to consumers). It
implements ``run_slice(slice_end)``: do work until ``trio.current_time() >= slice_end`` or until out of work, then
return True if it still has work, False if it found nothing to do. The system knows nothing else about it.

States (one per actor; only the system changes them)::

    IDLE --add--> SCHEDULED --worker pops it--> RUNNING --slice returns True, or resumed while running--> SCHEDULED
                      ^                            |
                      +--------resume-------- SUSPENDED <--slice returns False--+
    remove: any state --> IDLE (a running actor becomes IDLE when its slice ends and is not scheduled again)

Scheduling, after Linux CFS and QMQ's actor system:

- A ready min-heap ordered by ``(vruntime, seq)``. ``vruntime`` is the actor's accumulated run time, measured on
  ``trio.current_time()`` around each slice; ``seq`` is a counter taken at every push, so actors with equal vruntime
  take turns. An actor that costs more per slice (reading from disk, many consumers) is therefore picked less often,
  and every actor gets about the same run time while all are busy.
- ``workers`` tasks (default 1) pop the actor with the lowest vruntime, run one slice of ``slice_seconds`` (default
  5 ms), put it back on the heap if it still has work, and yield with a checkpoint so other tasks run between
  slices. Workers with nothing to do park in a ``ParkingLot``; a wake-up unparks one worker only when one is parked.
  More than one worker pays off only when slices await (disk reads): the slices of one actor never overlap, and
  workers that all stay runnable each run a slice in the same round of trio's scheduler, which makes the round,
  and so every other task's wait for its turn, that many slices long.
- Waking up (``resume`` of a suspended actor, or ``add``): ``vruntime = max(vruntime, min_vruntime - wake_slack)``
  (default slack 5 ms), where ``min_vruntime`` is the smallest vruntime among the ready and running actors, kept
  monotonic as in CFS so it survives moments when nothing runs. A quiet actor therefore cannot bank credit while
  suspended and then hold the workers for a long burst when it wakes: it runs ahead of the others for about
  ``wake_slack`` of run time at most.
- No lost wake-up: ``resume`` of a RUNNING actor sets a flag, and a worker whose slice returns False reschedules
  the actor instead of suspending it when the flag is set. The actor's "nothing to do" check and its suspension
  therefore cannot miss a resume that happened in between, whatever the slice awaited.
- ``resume`` is synchronous and cheap, since it is called on every put: one state check when the actor is already
  scheduled, one flag store when it is running, a heap push (and maybe one unpark) when it was suspended.
- Wake-up preemption (as in CFS): ``resume(actor, preempt=True)`` of a suspended actor that would be picked first
  (its clamped vruntime below every ready actor's) and that offers a synchronous slice (``run_slice_now``) runs that
  slice at once in the calling task, when no slice is in progress (or from an interlude, below). nsqd's channels
  are resumed this way by a publish: a quiet channel's message leaves in the publisher's own step instead of
  waiting for a worker's turn in trio's next round of runnable tasks (one round less on its way, which is most of
  its latency while a busy channel keeps those rounds long). The slice is charged to the actor as any other.
- Interludes: a slice may call ``interlude()`` at points where it is safe to let other code run (nothing half
  done); the system then runs its ``interlude_hook`` there, at most every ``interlude_seconds`` as the slice
  counts. The hook is given the paused actor's vruntime: what it runs should be work that comes before that
  actor in the fair order. nsqd's hook reads the connections that send little (``ReadPoller.poll_light``)
  and are not consumers of a channel at or behind the paused one (its own consumers' FINs wait for the
  poller's step): a producer of single messages waits for the next interlude of a busy channel's slice, not
  for the slice, the flushes after it and the poller's whole step. A preempting resume from inside the
  interlude may run that actor's slice right there, nested one level (the only way two slices are in progress
  with one worker: a quiet channel delivers while the busy one is paused between two consumers). Interlude
  time is not charged to the actor whose slice is paused, and the interludes of one slice stop once they have
  taken ``slice_seconds``, so the busy actor still gets at least half of its slices even when light work
  keeps coming.
- Work for others: a slice may tell the system that part of its time went to work whose amount does not follow
  its actor's share (``uncharge``); that part is not added to the actor's run time either. nsqd's channels leave
  out the writes of their consumers' frames at the end of a slice: a channel with 50 consumers at RDY 100 makes
  four times the writes per message of one with 2 at RDY 2500, and charged for them it delivered 15-20% fewer
  messages in the same run time.
- ``remove`` takes an actor out at once (out of the heap if scheduled, O(n), which is fine for a rare operation);
  a removed actor is never run again unless it is added again. ``clear`` takes them all out in O(n) (shutdown).

Invariants (asserted): an actor is in the ready heap at most once, only when SCHEDULED, and with its current
``seq``; a SCHEDULED or RUNNING actor is never SUSPENDED; one worker at a time runs a given actor; at most one
slice more than there are workers is in progress (the one nested in an interlude).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

__all__ = ["Actor", "ActorState", "ActorSystem", "ActorSystemStatistics"]


class ActorState(enum.Enum):
    IDLE = "idle"  # not in any system
    SCHEDULED = "scheduled"  # in the ready heap
    RUNNING = "running"  # a worker is inside its run_slice
    SUSPENDED = "suspended"  # in a system, waiting for resume()


_IDLE = ActorState.IDLE
_SCHEDULED = ActorState.SCHEDULED
_RUNNING = ActorState.RUNNING
_SUSPENDED = ActorState.SUSPENDED


class Actor:
    """Base class for units of work run by an ``ActorSystem``. Subclasses implement ``run_slice``.

    ``vruntime`` is the scheduling key (seconds of run time, clamped on wake-up); ``runtime`` and ``slices`` are the
    plain totals, for statistics. The ``_actor_*`` attributes belong to the system. Class-level defaults keep a
    subclass working even if its ``__init__`` does not call ``super().__init__()``.
    """

    vruntime: float = 0.0
    runtime: float = 0.0
    slices: int = 0
    _actor_state: ActorState = _IDLE
    _actor_seq: int = -1
    _actor_resumed: bool = False
    _actor_system: ActorSystem | None = None

    def __init__(self) -> None:
        self.vruntime = 0.0
        self.runtime = 0.0
        self.slices = 0
        self._actor_state = _IDLE
        self._actor_seq = -1
        self._actor_resumed = False
        self._actor_system = None

    @property
    def actor_state(self) -> ActorState:
        return self._actor_state

    async def run_slice(self, slice_end: float) -> bool:
        """Work until ``trio.current_time() >= slice_end`` or out of work. Return True if work remains."""
        raise NotImplementedError

    #: an actor whose slice never awaits may offer it as a plain call, ``run_slice_now(slice_end) -> bool``
    #: (the contract of ``run_slice``); then a preempting ``resume`` may run it in the caller's task
    run_slice_now: Callable[[float], bool] | None = None


@dataclass(frozen=True)
class ActorSystemStatistics:
    actors: int  # actors added and not removed
    ready: int  # actors waiting in the ready heap
    running: int  # actors inside a slice right now
    suspended: int  # actors waiting for resume()
    slices: int  # slices run since the system was created
    preempted: int  # of those, slices run at once by a preempting resume
    interludes: int  # interludes run from inside slices
    workers: int  # worker tasks configured
    parked_workers: int  # worker tasks waiting for work
    min_vruntime: float


class ActorSystem:
    """Runs actors on ``workers`` tasks, fairly by run time. See the module docstring for the algorithm."""

    def __init__(
        self, workers: int = 1, slice_seconds: float = 0.005, wake_slack: float = 0.005, interlude_seconds: float = 0.0
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, not {workers}")
        if not slice_seconds > 0:
            raise ValueError(f"slice_seconds must be > 0, not {slice_seconds}")
        if not wake_slack >= 0:
            raise ValueError(f"wake_slack must be >= 0, not {wake_slack}")
        if not interlude_seconds >= 0:
            raise ValueError(f"interlude_seconds must be >= 0, not {interlude_seconds}")
        self.workers = workers
        self.slice_seconds = slice_seconds
        self.wake_slack = wake_slack
        #: how often a slice offers an interlude (0: never); the slice decides where (``interlude``)
        self.interlude_seconds = interlude_seconds
        self._ready: list[tuple[float, int, Actor]] = []
        self._running: set[Actor] = set()
        self._actors: set[Actor] = set()
        self._seq = itertools.count()
        self._lot = trio.lowlevel.ParkingLot()
        self._min_vruntime = -math.inf
        self._slices = 0
        self._preempted = 0
        self._started = False
        #: what an interlude runs, given the paused actor's vruntime (nsqd: the read poller's ``poll_light``);
        #: None: slices offer none
        self.interlude_hook: Callable[[float], None] | None = None
        self._in_interlude = False
        self._interludes = 0
        self._lent = 0.0  # time the slice running now spent in interludes: not charged to its actor
        self._uncharged = 0.0  # time the slice running now did work for others (``uncharge``)

    # ---- public API -------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the worker tasks in a nursery of our own and run until cancelled.

        An actor interrupted mid-slice by the cancellation goes back to the ready heap, so ``run`` may be called
        again later and nothing is lost. An exception from ``run_slice`` propagates out of ``run`` (after the same
        cleanup) and stops the system.
        """
        if self._started:
            raise RuntimeError("ActorSystem.run is already running")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                for index in range(self.workers):
                    nursery.start_soon(self._worker, name=f"actor-worker-{index}")
                task_status.started()
        finally:
            self._started = False

    def add(self, actor: Actor) -> None:
        """Make ``actor`` part of this system and schedule one slice (it may already have work)."""
        if actor._actor_system is not None:
            raise ValueError("actor already belongs to an ActorSystem")
        actor._actor_system = self
        self._actors.add(actor)
        if actor._actor_state is _RUNNING:
            # Removed during a slice that has not ended yet: its worker will schedule it here when it ends.
            actor._actor_resumed = True
            return
        assert actor._actor_state is _IDLE, actor._actor_state
        actor._actor_state = _SUSPENDED
        self._wake(actor)

    def remove(self, actor: Actor) -> None:
        """Take ``actor`` out of this system; it is never run again (unless added again). Idempotent."""
        if actor._actor_system is not self:
            return
        actor._actor_system = None
        self._actors.discard(actor)
        state = actor._actor_state
        if state is _SCHEDULED:
            ready = self._ready
            for index, entry in enumerate(ready):
                if entry[2] is actor:
                    last = ready.pop()
                    if index < len(ready):
                        ready[index] = last
                        heapq.heapify(ready)
                    break
            else:  # pragma: no cover - the invariants make this impossible
                raise AssertionError("a SCHEDULED actor is missing from the ready heap")
            actor._actor_state = _IDLE
        elif state is _SUSPENDED:
            actor._actor_state = _IDLE
        # RUNNING: its worker sees that it left the system when the slice ends and makes it IDLE then.
        actor._actor_resumed = False

    def clear(self) -> None:
        """Take every actor out at once (a daemon's shutdown): ``remove`` of each scheduled one would rebuild the
        heap every time, O(n^2) for 20,000 channels with work left. Call it when no worker runs."""
        for actor in self._actors:
            actor._actor_system = None
            if actor._actor_state is not _RUNNING:
                actor._actor_state = _IDLE
            actor._actor_resumed = False
        self._actors.clear()
        self._ready.clear()

    def resume(self, actor: Actor, preempt: bool = False) -> None:
        """Tell the system that ``actor`` has work. Idempotent and cheap; does nothing if the actor is not here.
        ``preempt``: the caller may have the actor's slice run right here (wake-up preemption, see above)."""
        state = actor._actor_state
        if state is _SCHEDULED:
            return
        if state is _RUNNING:
            # Its slice may already have decided there is nothing to do: make the worker schedule it again.
            actor._actor_resumed = True
            return
        if state is _SUSPENDED and actor._actor_system is self:
            self._wake(
                actor,
                preempt
                and actor.run_slice_now is not None
                and self._started
                and (not self._running or self._in_interlude),
            )

    def interlude(self) -> None:
        """Run ``interlude_hook`` now, from inside the one slice in progress, at a safe point of its choosing
        (see the module docstring). A preempting resume made by the hook may run that actor's slice here,
        nested one level. The hook gets the running actor's vruntime. The time is not charged to the running
        actor. Does nothing when there is no hook, no slice or more than one in progress, inside an interlude,
        or once the interludes of this slice have taken ``slice_seconds``."""
        hook = self.interlude_hook
        if hook is None or self._in_interlude or len(self._running) != 1 or self._lent >= self.slice_seconds:
            return
        self._in_interlude = True
        self._interludes += 1
        clock = trio.current_time
        start = clock()
        try:
            hook(next(iter(self._running)).vruntime)
        finally:
            self._in_interlude = False
            self._lent += clock() - start

    def uncharge(self, seconds: float) -> None:
        """Leave ``seconds`` of the slice in progress out of its actor's run time: work it did for others, whose
        amount does not follow the actor's share (nsqd: writing consumers' frames, one write per consumer that
        ran out of credit, so as many more as a channel has more consumers with small windows)."""
        self._uncharged += seconds

    def statistics(self) -> ActorSystemStatistics:
        return ActorSystemStatistics(
            actors=len(self._actors),
            ready=len(self._ready),
            running=len(self._running),
            suspended=sum(1 for actor in self._actors if actor._actor_state is _SUSPENDED),
            slices=self._slices,
            preempted=self._preempted,
            interludes=self._interludes,
            workers=self.workers,
            parked_workers=len(self._lot),
            min_vruntime=self._min_vruntime,
        )

    def check_invariants(self) -> None:
        """Assert the scheduler's invariants over every actor (O(n); for tests and debugging)."""
        in_heap = [entry[2] for entry in self._ready]
        assert len(in_heap) == len(set(map(id, in_heap))), "an actor is in the ready heap twice"
        for vruntime, seq, actor in self._ready:
            assert actor._actor_state is _SCHEDULED, actor._actor_state
            assert actor._actor_seq == seq
            assert actor._actor_system is self
            assert vruntime == actor.vruntime
        for actor in self._running:
            assert actor._actor_state is _RUNNING, actor._actor_state
        for actor in self._actors:
            assert actor._actor_system is self
            assert actor._actor_state is not _IDLE
            if actor._actor_state is _SCHEDULED:
                assert any(entry[2] is actor for entry in self._ready)
        assert len(self._running) <= self.workers + 1  # + a slice run inside another's interlude

    # ---- internals --------------------------------------------------------------------------------------------

    def _push(self, actor: Actor) -> None:
        assert actor._actor_state is not _SCHEDULED, "an actor is never in the ready heap twice"
        assert actor._actor_system is self
        seq = next(self._seq)
        actor._actor_seq = seq
        actor._actor_state = _SCHEDULED
        heapq.heappush(self._ready, (actor.vruntime, seq, actor))

    def _update_min_vruntime(self, also: float = math.inf) -> None:
        lowest = also
        if self._ready:
            lowest = min(lowest, self._ready[0][0])
        for running in self._running:
            lowest = min(lowest, running.vruntime)
        if lowest != math.inf and lowest > self._min_vruntime:
            self._min_vruntime = lowest

    def _wake(self, actor: Actor, run_now: bool = False) -> None:
        """Schedule ``actor``; with ``run_now`` (the caller checked that it offers ``run_slice_now`` and that no
        slice is in progress, so slices never nest), run one slice of it here instead if it comes first."""
        assert actor._actor_state is _SUSPENDED, actor._actor_state
        self._update_min_vruntime()
        floor = self._min_vruntime - self.wake_slack
        if actor.vruntime < floor:
            actor.vruntime = floor
        if run_now and not (self._ready and self._ready[0][0] <= actor.vruntime):
            self._run_now(actor)
            return
        self._push(actor)  # a preempting wake-up too when another actor has less run time: turns as usual
        if self._lot:
            self._lot.unpark()

    def _run_now(self, actor: Actor) -> None:
        actor._actor_state = _RUNNING
        actor._actor_resumed = False
        self._running.add(actor)
        self._preempted += 1
        clock = trio.current_time
        nested = self._in_interlude  # inside another slice's interlude: that slice's lent time is left alone
        if not nested:
            self._lent = 0.0  # no other slice is in progress: the lent time is this one's
        outer_uncharged = self._uncharged  # the paused slice's, when nested
        self._uncharged = 0.0
        start = clock()
        try:
            has_work = actor.run_slice_now(start + self.slice_seconds)  # type: ignore[misc]  # the caller checked it
        except BaseException:
            has_work = True  # as in a worker: the actor stays schedulable, the error goes to the caller
            raise
        finally:
            elapsed = clock() - start - self._uncharged
            self._uncharged = outer_uncharged
            if not nested:
                elapsed -= self._lent
            self._end_slice(actor, has_work, elapsed)
            if actor._actor_state is _SCHEDULED and self._lot:
                self._lot.unpark()

    def _end_slice(self, actor: Actor, has_work: bool, elapsed: float) -> None:
        assert actor._actor_state is _RUNNING, actor._actor_state
        self._running.discard(actor)
        actor.vruntime += elapsed
        actor.runtime += elapsed
        actor.slices += 1
        self._slices += 1
        owner = actor._actor_system
        again = has_work or actor._actor_resumed
        actor._actor_resumed = False
        if owner is None:  # removed during the slice
            actor._actor_state = _IDLE
            return
        if owner is not self:  # removed, then added to another system during the slice
            actor._actor_state = _SUSPENDED
            owner._wake(actor)
            return
        self._update_min_vruntime(actor.vruntime)
        if again:
            self._push(actor)
            # This worker takes the next actor itself; wake another only if there is more than that to do.
            if len(self._ready) > 1 and self._lot:
                self._lot.unpark()
        else:
            actor._actor_state = _SUSPENDED

    async def _worker(self) -> None:
        ready = self._ready
        while True:
            if not ready:
                # No await between the emptiness check and parking: a wake-up in between cannot be missed.
                await self._lot.park()
                continue
            _, seq, actor = heapq.heappop(ready)
            assert actor._actor_state is _SCHEDULED, actor._actor_state
            assert actor._actor_seq == seq, "stale ready-heap entry"
            assert actor._actor_system is self
            assert actor not in self._running, "an actor runs on one worker at a time"
            actor._actor_state = _RUNNING
            actor._actor_resumed = False
            self._running.add(actor)
            self._lent = 0.0
            self._uncharged = 0.0
            start = trio.current_time()
            try:
                has_work = await actor.run_slice(start + self.slice_seconds)
            except BaseException:
                # Cancelled (the system stops) or a bug in the actor: keep it schedulable for a later run().
                self._end_slice(actor, True, trio.current_time() - start - self._lent - self._uncharged)
                raise
            self._end_slice(actor, has_work, trio.current_time() - start - self._lent - self._uncharged)
            await trio.lowlevel.checkpoint()
