"""ActorSystem tests. Time-dependent ones run on trio's MockClock (autojump_clock fixture): an actor "works" by
sleeping on the mock clock, so run times are exact and the tests deterministic."""

import random

import pytest
import trio
import trio.testing

from nsqd.actors import Actor, ActorState, ActorSystem, ActorSystemStatistics


def jain(values):
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


class BusyActor(Actor):
    """Always has work (while ``awake``); each unit costs ``cost`` seconds and at least one unit runs per slice."""

    def __init__(self, name, cost, log=None, awake=True):
        super().__init__()
        self.name = name
        self.cost = cost
        self.log = log
        self.awake = awake
        self.units = 0
        self.inside = 0

    async def run_slice(self, slice_end):
        assert self.inside == 0, "run twice at once"
        self.inside += 1
        try:
            if not self.awake:
                return False
            if self.log is not None:
                self.log.append(self.name)
            while True:
                await trio.sleep(self.cost)
                self.units += 1
                if trio.current_time() >= slice_end:
                    return True
        finally:
            self.inside -= 1


class MailboxActor(Actor):
    """Processes items from a list, ``cost`` seconds each; out of work when the list is empty."""

    def __init__(self, cost=0.0):
        super().__init__()
        self.cost = cost
        self.items = []
        self.done = []

    async def run_slice(self, slice_end):
        while self.items:
            if self.cost:
                await trio.sleep(self.cost)
            self.done.append(self.items.pop(0))
            if trio.current_time() >= slice_end:
                return bool(self.items)
        return False


async def run_system_for(system, seconds, setup=None):
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        if setup is not None:
            nursery.start_soon(setup)
        await trio.sleep(seconds)
        system.check_invariants()
        nursery.cancel_scope.cancel()


# ---- fairness ------------------------------------------------------------------------------------------------------


async def test_fairness_two_busy_actors_with_different_costs(autojump_clock):
    # One unit costs 1 ms for the cheap actor (5 units per 5 ms slice) and 20 ms for the dear one (one unit per
    # slice, 20 ms). Turn-taking would give a 1:4 split of run time; vruntime ordering gives 1:1.
    system = ActorSystem(workers=1)
    cheap, dear = BusyActor("cheap", 0.001), BusyActor("dear", 0.020)
    system.add(cheap)
    system.add(dear)
    await run_system_for(system, 20.0)
    assert cheap.runtime + dear.runtime == pytest.approx(20.0, abs=0.05)
    assert cheap.runtime == pytest.approx(dear.runtime, rel=0.02)
    assert jain([cheap.runtime, dear.runtime]) > 0.999
    assert cheap.slices > 3 * dear.slices  # the cheap one got about 4 slices per dear one (float rounding aside)


async def test_fairness_three_actors_on_two_workers(autojump_clock):
    system = ActorSystem(workers=2)
    actors = [BusyActor("a", 0.001), BusyActor("b", 0.004), BusyActor("c", 0.013)]
    for actor in actors:
        system.add(actor)
    await run_system_for(system, 30.0)
    runtimes = [actor.runtime for actor in actors]
    assert sum(runtimes) == pytest.approx(60.0, abs=0.1)  # both workers always busy
    assert jain(runtimes) > 0.999
    for runtime in runtimes:
        assert runtime == pytest.approx(20.0, rel=0.03)


# ---- suspend / resume ------------------------------------------------------------------------------------------


async def test_add_runs_once_then_suspends_and_resume_wakes_it():
    system = ActorSystem(workers=2)
    actor = MailboxActor()
    assert actor.actor_state is ActorState.IDLE
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.slices == 1  # add schedules one slice: the actor may have had work before it was added
        assert actor.actor_state is ActorState.SUSPENDED
        stats = system.statistics()
        assert (stats.actors, stats.suspended, stats.ready, stats.running, stats.parked_workers) == (1, 1, 0, 0, 2)

        # Suspended: nothing runs it until resume.
        actor.items.append("x")
        await trio.testing.wait_all_tasks_blocked()
        assert actor.slices == 1 and actor.done == []

        system.resume(actor)
        assert actor.actor_state is ActorState.SCHEDULED
        await trio.testing.wait_all_tasks_blocked()
        assert actor.done == ["x"] and actor.slices == 2
        assert actor.actor_state is ActorState.SUSPENDED
        system.check_invariants()
        nursery.cancel_scope.cancel()


async def test_resume_is_idempotent_while_scheduled():
    system = ActorSystem(workers=1)
    actor = MailboxActor()
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.testing.wait_all_tasks_blocked()
        actor.items.extend(range(5))
        for _ in range(100):  # one resume per put, with no checkpoint in between
            system.resume(actor)
        assert system.statistics().ready == 1
        system.check_invariants()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.done == [0, 1, 2, 3, 4]
        assert actor.slices == 2
        nursery.cancel_scope.cancel()


async def test_resume_of_unknown_actor_does_nothing():
    system = ActorSystem(workers=1)
    stranger = MailboxActor()
    system.resume(stranger)
    assert stranger.actor_state is ActorState.IDLE
    assert system.statistics().ready == 0


async def test_actor_with_backlog_runs_in_slices_until_empty(autojump_clock):
    system = ActorSystem(workers=1, slice_seconds=0.005)
    actor = MailboxActor(cost=0.001)
    actor.items.extend(range(23))
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.sleep(1)
        assert actor.done == list(range(23))
        assert actor.slices == 5  # 5 + 5 + 5 + 5 + 3 items
        assert actor.actor_state is ActorState.SUSPENDED
        assert actor.runtime == pytest.approx(0.023)
        nursery.cancel_scope.cancel()


# ---- the lost wake-up ------------------------------------------------------------------------------------------


class RacyActor(MailboxActor):
    """Finds its mailbox empty, then awaits something (a flush, say) before returning False: the window in which
    a put + resume must not be lost."""

    def __init__(self):
        super().__init__()
        self.in_window = trio.Event()
        self.gate = trio.Event()

    async def run_slice(self, slice_end):
        while self.items:
            self.done.append(self.items.pop(0))
        if not self.in_window.is_set():
            self.in_window.set()
            await self.gate.wait()
        return False


async def test_resume_while_running_after_empty_check_is_not_lost():
    system = ActorSystem(workers=1)
    actor = RacyActor()
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await actor.in_window.wait()
        assert actor.actor_state is ActorState.RUNNING
        actor.items.append("late")
        system.resume(actor)  # costs one flag store: the actor is running
        assert actor.actor_state is ActorState.RUNNING
        actor.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.done == ["late"]
        assert actor.slices == 2
        assert actor.actor_state is ActorState.SUSPENDED
        nursery.cancel_scope.cancel()


class SelfResumingActor(MailboxActor):
    """Its own slice puts an item after the empty check (a consumer becoming ready during the slice, say)."""

    def __init__(self, system):
        super().__init__()
        self.system = system
        self.fed = False

    async def run_slice(self, slice_end):
        while self.items:
            self.done.append(self.items.pop(0))
        if not self.fed:
            self.fed = True
            self.items.append("own")
            self.system.resume(self)
        return False


async def test_resume_during_own_slice_is_not_lost():
    system = ActorSystem(workers=1)
    actor = SelfResumingActor(system)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.done == ["own"]
        assert actor.actor_state is ActorState.SUSPENDED
        nursery.cancel_scope.cancel()


# ---- the CFS clamp ---------------------------------------------------------------------------------------------


def longest_run(log, name):
    best = current = 0
    for entry in log:
        current = current + 1 if entry == name else 0
        best = max(best, current)
    return best


async def test_woken_actor_does_not_monopolise_the_workers(autojump_clock):
    log = []
    system = ActorSystem(workers=1, slice_seconds=0.005, wake_slack=0.005)
    busy = BusyActor("busy", 0.001, log)
    sleeper = BusyActor("sleeper", 0.001, log, awake=False)
    system.add(busy)
    system.add(sleeper)

    async def wake_later():
        await trio.sleep(10.0)
        assert sleeper.vruntime == 0.0  # it has run nothing: without the clamp it would be owed 10 s
        sleeper.awake = True
        system.resume(sleeper)
        assert (
            sleeper.vruntime >= busy.vruntime - 0.005 - 0.005
        )  # clamped to min_vruntime - slack (busy may be mid-slice)

    await run_system_for(system, 12.0, wake_later)
    woken_at = log.index("sleeper")
    after = log[woken_at:]
    # At most wake_slack / slice worth of extra slices, plus the alternation itself.
    assert longest_run(after, "sleeper") <= 2
    assert longest_run(after, "busy") <= 2
    assert after.count("sleeper") == pytest.approx(after.count("busy"), abs=3)
    assert busy.runtime == pytest.approx(11.0, abs=0.05)
    assert sleeper.runtime == pytest.approx(1.0, abs=0.05)


async def test_new_actor_starts_near_min_vruntime(autojump_clock):
    log = []
    system = ActorSystem(workers=1)
    old = BusyActor("old", 0.001, log)
    system.add(old)
    new = BusyActor("new", 0.001, log)

    async def add_later():
        await trio.sleep(5.0)
        system.add(new)

    await run_system_for(system, 6.0, add_later)
    assert longest_run(log[log.index("new") :], "new") <= 2
    assert new.runtime == pytest.approx(0.5, abs=0.02)


# ---- remove ----------------------------------------------------------------------------------------------------


async def test_removed_scheduled_actor_never_runs(autojump_clock):
    system = ActorSystem(workers=1)
    busy = BusyActor("busy", 0.001)
    victim = MailboxActor()
    victim.items.append("never")
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(busy)
        await trio.sleep(0.0025)  # the only worker is inside busy's slice
        system.add(victim)
        system.check_invariants()
        assert victim.actor_state is ActorState.SCHEDULED
        system.remove(victim)
        system.remove(victim)  # idempotent
        assert victim.actor_state is ActorState.IDLE
        system.check_invariants()
        system.resume(victim)
        assert victim.actor_state is ActorState.IDLE
        await trio.sleep(1.0)
        assert victim.slices == 0 and victim.done == []
        assert system.statistics().actors == 1
        nursery.cancel_scope.cancel()


async def test_clear_takes_every_actor_out_and_they_can_come_back(autojump_clock):
    system = ActorSystem(workers=1)
    scheduled = [MailboxActor() for _ in range(5)]
    for actor in scheduled:
        actor.items.append("left")
        system.add(actor)  # no worker runs yet: all of them wait in the ready heap
    assert system.statistics().ready == 5
    system.clear()
    system.check_invariants()
    assert system.statistics().actors == 0 and system.statistics().ready == 0
    assert all(actor.actor_state is ActorState.IDLE for actor in scheduled)
    system.remove(scheduled[0])  # after clear, a remove is a no-op
    system.resume(scheduled[1])
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        await trio.sleep(1.0)
        assert all(actor.slices == 0 for actor in scheduled)
        system.add(scheduled[2])  # a cleared actor can be added again
        await trio.sleep(1.0)
        assert scheduled[2].done == ["left"] and scheduled[3].slices == 0
        system.check_invariants()
        nursery.cancel_scope.cancel()


async def test_removed_running_actor_is_not_rescheduled(autojump_clock):
    system = ActorSystem(workers=2)
    busy = BusyActor("busy", 0.010)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(busy)
        await trio.sleep(0.005)
        assert busy.actor_state is ActorState.RUNNING
        system.remove(busy)
        system.resume(busy)  # a put racing with the channel's deletion
        assert system.statistics().actors == 0
        await trio.sleep(1.0)
        assert busy.slices == 1  # the slice in progress ended, and nothing followed even though it had work
        assert busy.actor_state is ActorState.IDLE
        system.check_invariants()
        stats = system.statistics()
        assert (stats.ready, stats.running, stats.parked_workers) == (0, 0, 2)

        system.add(busy)  # back again
        await trio.sleep(1.0)
        assert busy.slices > 50
        nursery.cancel_scope.cancel()


async def test_removed_suspended_actor_ignores_resume():
    system = ActorSystem(workers=1)
    actor = MailboxActor()
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.testing.wait_all_tasks_blocked()
        system.remove(actor)
        assert actor.actor_state is ActorState.IDLE
        actor.items.append("x")
        system.resume(actor)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.done == [] and actor.slices == 1
        nursery.cancel_scope.cancel()


async def test_remove_and_readd_during_a_slice_never_overlaps(autojump_clock):
    system = ActorSystem(workers=3)
    busy = BusyActor("busy", 0.010)  # asserts that it is never run twice at once
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(busy)
        await trio.sleep(0.005)
        system.remove(busy)
        system.add(busy)
        assert busy.actor_state is ActorState.RUNNING
        system.check_invariants()
        await trio.sleep(1.0)
        assert busy.slices == 100  # one 10 ms unit per slice, back to back, on one worker at a time
        nursery.cancel_scope.cancel()


def test_add_twice_is_an_error():
    system, other = ActorSystem(), ActorSystem()
    actor = MailboxActor()
    system.add(actor)
    with pytest.raises(ValueError):
        system.add(actor)
    with pytest.raises(ValueError):
        other.add(actor)


# ---- concurrency -----------------------------------------------------------------------------------------------


async def test_workers_run_different_actors_concurrently(autojump_clock):
    system = ActorSystem(workers=4)
    inside = 0
    peak = 0

    class Sleeper(Actor):
        async def run_slice(self, slice_end):
            nonlocal inside, peak
            inside += 1
            peak = max(peak, inside)
            await trio.sleep(1.0)  # a disk read, say
            inside -= 1
            return True

    actors = [Sleeper() for _ in range(6)]
    for actor in actors:
        system.add(actor)
    await run_system_for(system, 3.0)
    assert peak == 4
    # 4 workers x 3 s of 1 s slices, fairly spread.
    assert sum(actor.slices for actor in actors) == 12
    assert {actor.slices for actor in actors} == {2}


async def test_an_actor_is_never_run_twice_at_once(autojump_clock):
    system = ActorSystem(workers=4, slice_seconds=0.003)
    rng = random.Random(7)

    class Flaky(Actor):
        def __init__(self):
            super().__init__()
            self.inside = False
            self.pending = 0

        async def run_slice(self, slice_end):
            assert not self.inside, "run twice at once"
            self.inside = True
            try:
                while self.pending and trio.current_time() < slice_end:
                    self.pending -= 1
                    await trio.sleep(rng.choice([0.0, 0.0005, 0.002]))
                return bool(self.pending)
            finally:
                self.inside = False

    actors = [Flaky() for _ in range(6)]
    for actor in actors:
        system.add(actor)

    async def hammer():
        for _ in range(3000):
            actor = rng.choice(actors)
            actor.pending += rng.randrange(3)
            system.resume(actor)
            if rng.random() < 0.01:
                system.remove(actor)
                system.add(actor)
            system.check_invariants()
            await trio.sleep(rng.choice([0.0, 0.0, 0.001]))

    await run_system_for(system, 10.0, hammer)
    assert sum(actor.slices for actor in actors) > 1000
    for actor in actors:
        assert actor.pending == 0  # every resume led to the work being done
        assert actor.actor_state is ActorState.SUSPENDED


async def test_workers_yield_between_slices():
    system = ActorSystem(workers=1)

    class Spinner(Actor):
        """Never awaits; has work for 2000 slices."""

        async def run_slice(self, slice_end):
            return self.slices < 1999

    spinner = Spinner()
    seen = set()
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(spinner)
        while spinner.slices < 2000:
            seen.add(spinner.slices)
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert len(seen) > 100  # this task ran between the actor's slices


# ---- lifecycle and statistics ----------------------------------------------------------------------------------


async def test_cancel_mid_slice_keeps_the_actor_and_run_can_restart(autojump_clock):
    system = ActorSystem(workers=1)
    actor = BusyActor("a", 1.0)
    system.add(actor)
    with trio.move_on_after(0.5):
        await system.run()
    assert actor.actor_state is ActorState.SCHEDULED
    system.check_invariants()
    await run_system_for(system, 3.5)
    assert actor.units == 3


async def test_run_slice_exception_propagates():
    system = ActorSystem(workers=2)

    class Broken(Actor):
        async def run_slice(self, slice_end):
            raise RuntimeError("boom")

    system.add(Broken())
    with pytest.raises(RuntimeError, match="boom"):
        # trio wraps a task's exception in an ExceptionGroup only with strict groups; accept either.
        try:
            await system.run()
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None


async def test_run_twice_at_once_is_an_error():
    system = ActorSystem(workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        with pytest.raises(RuntimeError):
            await system.run()
        nursery.cancel_scope.cancel()


def test_invalid_arguments():
    with pytest.raises(ValueError):
        ActorSystem(workers=0)
    with pytest.raises(ValueError):
        ActorSystem(slice_seconds=0)
    with pytest.raises(ValueError):
        ActorSystem(wake_slack=-1)
    with pytest.raises(ValueError):
        ActorSystem(interlude_seconds=-0.001)


async def test_statistics(autojump_clock):
    system = ActorSystem(workers=2)
    busy = [BusyActor(str(n), 0.010) for n in range(3)]
    idle = MailboxActor()
    for actor in [*busy, idle]:
        system.add(actor)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        await trio.sleep(0.105)
        stats = system.statistics()
        assert isinstance(stats, ActorSystemStatistics)
        assert stats.actors == 4
        assert stats.running == 2 and stats.ready == 1 and stats.suspended == 1
        assert stats.workers == 2 and stats.parked_workers == 0
        assert stats.slices == idle.slices + sum(actor.slices for actor in busy)
        assert stats.slices == 1 + 20  # idle's empty slice + 2 workers x 10 slices of 10 ms
        assert stats.min_vruntime > 0
        with pytest.raises(AttributeError):
            stats.actors = 0
        nursery.cancel_scope.cancel()


# ---- wake-up preemption ---------------------------------------------------------------------------------------


class SyncMailboxActor(MailboxActor):
    """A MailboxActor whose slice never awaits, offered as ``run_slice_now`` too (as nsqd's channel dispatcher)."""

    def __init__(self, system=None):
        super().__init__()
        self.system = system
        self.nested = []

    def run_slice_now(self, slice_end):
        while self.items:
            item = self.items.pop(0)
            self.done.append(item)
            if self.system is not None and item == "resume-other":
                # a slice that resumes another actor: that one must not run inside this slice
                other = self.nested[0]
                self.system.resume(other, preempt=True)
        return False

    async def run_slice(self, slice_end):
        return self.run_slice_now(slice_end)


async def test_preempting_resume_runs_a_quiet_actor_in_the_caller():
    system = ActorSystem()
    actor = SyncMailboxActor()
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.actor_state is ActorState.SUSPENDED and actor.slices == 1

        actor.items.append("a")
        system.resume(actor, preempt=True)
        # no checkpoint in between: the slice ran inside resume, and was charged to the actor
        assert actor.done == ["a"]
        assert actor.actor_state is ActorState.SUSPENDED
        assert actor.slices == 2 and system.statistics().preempted == 1

        # a plain resume still leaves the slice to a worker
        actor.items.append("b")
        system.resume(actor)
        assert actor.done == ["a"] and actor.actor_state is ActorState.SCHEDULED
        await trio.testing.wait_all_tasks_blocked()
        assert actor.done == ["a", "b"] and system.statistics().preempted == 1
        system.check_invariants()
        nursery.cancel_scope.cancel()


async def test_preemption_waits_its_turn_behind_an_actor_with_less_run_time(autojump_clock):
    system = ActorSystem(slice_seconds=0.005, wake_slack=0.0)
    quiet = SyncMailboxActor()
    busy = BusyActor("busy", 0.001)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(quiet)
        await trio.testing.wait_all_tasks_blocked()
        quiet.vruntime = 1.0  # as if it had run for a second already: the busy actor comes first
        system.add(busy)
        quiet.items.append("x")
        system.resume(quiet, preempt=True)
        assert quiet.done == [] and quiet.actor_state is ActorState.SCHEDULED
        assert system.statistics().preempted == 0
        system.check_invariants()
        nursery.cancel_scope.cancel()


async def test_preemption_needs_a_synchronous_slice_and_never_nests():
    system = ActorSystem()
    plain = MailboxActor()  # no run_slice_now: always left to a worker
    outer = SyncMailboxActor(system)
    inner = SyncMailboxActor()
    outer.nested.append(inner)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        for actor in (plain, outer, inner):
            system.add(actor)
        await trio.testing.wait_all_tasks_blocked()

        plain.items.append("p")
        system.resume(plain, preempt=True)
        assert plain.done == [] and plain.actor_state is ActorState.SCHEDULED
        await trio.testing.wait_all_tasks_blocked()
        assert plain.done == ["p"]

        inner.items.append("i")
        outer.items.append("resume-other")
        system.resume(outer, preempt=True)
        # outer ran at once; inner, resumed from inside outer's slice, waits for a worker
        assert outer.done == ["resume-other"] and inner.done == []
        assert inner.actor_state is ActorState.SCHEDULED
        assert system.statistics().preempted == 1
        await trio.testing.wait_all_tasks_blocked()
        assert inner.done == ["i"]
        system.check_invariants()
        nursery.cancel_scope.cancel()


async def test_preemption_only_while_the_system_runs():
    system = ActorSystem()
    actor = SyncMailboxActor()
    system.add(actor)  # not running: add leaves the first slice to a worker
    actor.items.append("x")
    system.resume(actor, preempt=True)
    assert actor.done == [] and actor.actor_state is ActorState.SCHEDULED


# ---- interludes ----------------------------------------------------------------------------------------------------


class PausingActor(Actor):
    """A synchronous slice in steps: each step "works" ``cost`` seconds (a jump of the mock clock) and then offers
    the system an interlude, as nsqd's dispatcher does between two consumers. ``log`` records the steps."""

    def __init__(self, system, clock, name, steps=3, cost=0.0005, log=None):
        super().__init__()
        self.system = system
        self.clock = clock
        self.name = name
        self.steps = steps
        self.cost = cost
        self.log = log if log is not None else []
        self.items = []
        self.done = []

    def run_slice_now(self, slice_end):
        while self.items:
            self.done.append(self.items.pop(0))
            self.clock.jump(self.cost)
        for step in range(self.steps):
            self.clock.jump(self.cost)
            self.log.append((self.name, step))
            self.system.interlude()
        return False

    async def run_slice(self, slice_end):
        return self.run_slice_now(slice_end)


async def run_quiet_then_busy(system, quiet, busy):
    """Add ``quiet`` (it runs once and suspends), then ``busy`` ranked behind it, and run until all is idle."""
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(quiet)
        await trio.testing.wait_all_tasks_blocked()
        quiet.vruntime = 0.0
        busy.vruntime = 7.0  # the hook is told where the paused actor stands: what comes before it may run
        quiet.runtime = busy.runtime = 0.0
        system.add(busy)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()


async def test_an_interlude_delivers_for_a_quiet_actor_inside_a_busy_slice(autojump_clock):
    clock = autojump_clock
    system = ActorSystem(slice_seconds=0.050, wake_slack=0.0, interlude_seconds=0.0001)
    log = []
    quiet = PausingActor(system, clock, "quiet", steps=0, cost=0.003, log=log)
    busy = PausingActor(system, clock, "busy", steps=3, cost=0.0005, log=log)

    def hook(below):
        log.append(("hook", below))
        # what reading a producer's PUB does: costs time, then wakes the quiet actor with preemption
        clock.jump(0.002)
        if not quiet.done and not quiet.items:
            quiet.items.append("message")
            log.append(("publish", len(system._running)))
            system.resume(quiet, preempt=True)
            log.append(("delivered", list(quiet.done)))
            system.check_invariants()  # two slices in progress with one worker: the nested one is allowed

    system.interlude_hook = hook
    await run_quiet_then_busy(system, quiet, busy)
    # the quiet actor's message went out in busy's first interlude, between busy's steps, not after its slice
    assert log == [
        ("busy", 0),
        ("hook", 7.0),
        ("publish", 1),
        ("delivered", ["message"]),
        ("busy", 1),
        ("hook", 7.0),
        ("busy", 2),
        ("hook", 7.0),
    ]
    stats = system.statistics()
    assert stats.interludes == 3 and stats.preempted == 1
    # each is charged its own work only: busy 3 x 0.5 ms (not the 3 x 2 ms of the hook, nor quiet's 3 ms)
    assert busy.runtime == pytest.approx(0.0015)
    assert quiet.runtime == pytest.approx(0.003)
    assert quiet.actor_state is ActorState.SUSPENDED and busy.actor_state is ActorState.SUSPENDED


class UnchargingActor(PausingActor):
    """A PausingActor whose slice first does ``others`` seconds of work for others (nsqd: consumers' writes) and
    leaves it uncharged."""

    def __init__(self, *args, others=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.others = others

    def run_slice_now(self, slice_end):
        self.clock.jump(self.others)
        self.system.uncharge(self.others)
        return super().run_slice_now(slice_end)


async def test_work_for_others_is_not_charged_even_around_a_nested_slice(autojump_clock):
    clock = autojump_clock
    system = ActorSystem(slice_seconds=0.050, wake_slack=0.0, interlude_seconds=0.0001)
    quiet = UnchargingActor(system, clock, "quiet", steps=0, cost=0.003, others=0.004)
    busy = UnchargingActor(system, clock, "busy", steps=3, cost=0.0005, others=0.001)

    def hook(below):
        clock.jump(0.002)
        if not quiet.done and not quiet.items:
            quiet.items.append("message")
            system.resume(quiet, preempt=True)  # runs quiet's slice here, nested in busy's

    system.interlude_hook = hook
    await run_quiet_then_busy(system, quiet, busy)
    assert quiet.done == ["message"] and system.statistics().preempted == 1
    # busy: its 3 x 0.5 ms; not its own 1 ms for others (made before the nested slice, which must not reset
    # it), nor the hooks' 3 x 2 ms, nor quiet's slice; quiet: its 3 ms, not its 4 ms for others
    assert busy.runtime == pytest.approx(0.0015)
    assert quiet.runtime == pytest.approx(0.003)


async def test_an_interlude_without_a_slice_or_inside_another_does_nothing(autojump_clock):
    system = ActorSystem(interlude_seconds=0.0001)
    calls = []

    def hook(below):
        calls.append(len(system._running))
        system.interlude()  # from inside an interlude: not entered again

    system.interlude()  # no hook yet
    system.interlude_hook = hook
    system.interlude()  # no slice in progress
    assert calls == []
    busy = PausingActor(system, autojump_clock, "busy", steps=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(busy)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert calls == [1, 1] and system.statistics().interludes == 2


def system_with_costly_interludes(clock, cost, record):
    """A system of 5 ms slices whose interlude hook takes ``cost`` seconds and appends ``record(system)`` to the
    list returned with it."""
    system = ActorSystem(slice_seconds=0.005, interlude_seconds=0.0001)
    calls = []

    def hook(below):
        calls.append(record(system))
        clock.jump(cost)

    system.interlude_hook = hook
    return system, calls


async def test_the_interludes_of_one_slice_stop_after_a_slice_of_time(autojump_clock):
    """Light work cannot take a busy actor's whole turn: once the interludes of a slice used ``slice_seconds``,
    the rest of that slice runs without them; the next slice offers them again."""
    clock = autojump_clock
    system, calls = system_with_costly_interludes(clock, 0.002, lambda system: busy.slices)
    busy = PausingActor(system, clock, "busy", steps=6)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(busy)
        await trio.testing.wait_all_tasks_blocked()
        assert calls == [0, 0, 0]  # 2 + 2 + 2 ms: the third one reaches 5 ms, the last three steps run alone
        busy.items.append("more")
        system.resume(busy)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert calls == [0, 0, 0, 1, 1, 1]
    assert busy.runtime == pytest.approx(2 * 6 * 0.0005 + 0.0005)  # the steps and the item, never the hook


async def test_a_preempting_slice_is_not_charged_for_its_interludes(autojump_clock):
    """A slice run at once by a preempting resume (no other slice in progress) may offer interludes too."""
    clock = autojump_clock
    system, calls = system_with_costly_interludes(clock, 0.001, lambda system: len(system._running))
    actor = PausingActor(system, clock, "actor", steps=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        system.add(actor)
        await trio.testing.wait_all_tasks_blocked()
        before = actor.runtime
        actor.items.append("x")
        system.resume(actor, preempt=True)
        assert actor.done == ["x"] and system.statistics().preempted == 1
        assert actor.runtime - before == pytest.approx(3 * 0.0005)
        nursery.cancel_scope.cancel()
    assert calls == [1, 1, 1, 1]
