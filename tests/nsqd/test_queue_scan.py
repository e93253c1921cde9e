"""QueueScanner tests, all on trio's MockClock (autojump_clock fixture)."""

import random
from functools import partial

import pytest
import trio
import trio.testing

from nsqd.message import Message
from nsqd.queue_scan import QueueScanner, QueueScannerStatistics
from nsqd.queues.deferred import DeferredQueue
from nsqd.queues.inflight import InFlightQueue


class FakeChannel:
    """A channel reduced to its two timed queues; records when it was scanned and what it moved."""

    def __init__(self, name="c"):
        self.name = name
        self.in_flight = InFlightQueue()
        self.deferred = DeferredQueue()
        self.calls = []  # the `now` of every process_queues call
        self.moved = []  # (now, item)

    def process_queues(self, now):
        self.calls.append(now)
        assert now == trio.current_time()
        items = [message.client for message in self.in_flight.pop_expired(now)] + self.deferred.pop_due(now)
        self.moved.extend((now, item) for item in items)
        return bool(items)

    def has_timed_work(self):
        return bool(len(self.in_flight) or len(self.deferred))


def push_in_flight(channel, name: bytes, item, deadline: float) -> None:
    """Put ``item`` in flight in ``channel`` until ``deadline``: a message with the ID ``name`` (padded to 16 bytes)
    and ``item`` as its client, which ``FakeChannel.process_queues`` records when it expires."""
    message = Message(name.ljust(16, b"."), b"", 0)
    message.client = item
    channel.in_flight.push(message, deadline)


#: a deadline no test reaches: the channel stays active (something in flight) without ever being dirty
FAR = 1e9


def busy(channel, name=b"far"):
    """``channel`` with a message in flight until ``FAR``: active for the scanner, never dirty."""
    push_in_flight(channel, name, "far", FAR)
    return channel


class DirtyFor(FakeChannel):
    """Reports dirty for its first ``times`` scans, clean afterwards; always has timed work."""

    def __init__(self, times, name="d"):
        super().__init__(name)
        self.times = times

    def process_queues(self, now):
        self.calls.append(now)
        return len(self.calls) <= self.times

    def has_timed_work(self):
        return True


async def wait_blocked():
    await trio.testing.wait_all_tasks_blocked()


def wire(scanner, channel):
    """What nsqd does for each new channel: its queues tell the scanner when they start holding something."""
    channel.in_flight.on_active = channel.deferred.on_active = partial(scanner.activate, channel)
    return channel


def scanner_for(channels, **kwargs):
    kwargs.setdefault("rng", random.Random(42))
    scanner = QueueScanner(lambda: channels, **kwargs)
    for channel in channels:
        wire(scanner, channel)
    return scanner


async def test_expired_and_due_items_are_processed_within_an_interval(autojump_clock):
    rng = random.Random(3)
    channels = [FakeChannel(str(n)) for n in range(12)]
    expected = {}
    for channel in channels:
        for n in range(20):
            deadline = rng.uniform(0.0, 3.0)
            push_in_flight(channel, b"%s-%d" % (channel.name.encode(), n), ("inflight", channel.name, n), deadline)
            expected[("inflight", channel.name, n)] = deadline
            due = rng.uniform(0.0, 3.0)
            channel.deferred.push(("deferred", channel.name, n), due)
            expected[("deferred", channel.name, n)] = due
    scanner = scanner_for(channels)  # 12 channels <= selection_count 20: every tick samples them all
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await trio.sleep(3.5)
        nursery.cancel_scope.cancel()
    moved = {item: when for channel in channels for when, item in channel.moved}
    assert moved.keys() == expected.keys()
    for item, when in moved.items():
        assert expected[item] <= when <= expected[item] + 0.1 + 1e-9, item


async def test_scans_every_interval_and_samples_without_repeats(autojump_clock):
    channels = [busy(FakeChannel(str(n))) for n in range(30)]
    scanner = scanner_for(channels, selection_count=20)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        start = trio.current_time()
        await trio.sleep(1.05)
        nursery.cancel_scope.cancel()
    times = sorted({round(now - start, 6) for channel in channels for now in channel.calls})
    assert times == pytest.approx([0.1 * k for k in range(1, 11)])
    for tick in times:
        called = [channel for channel in channels for now in channel.calls if round(now - start, 6) == tick]
        assert len(called) == 20 and len(set(map(id, called))) == 20
    # Random sampling reaches every channel sooner or later.
    assert all(channel.calls for channel in channels)
    stats = scanner.statistics()
    assert stats.ticks == 10 and stats.scans == 10 and stats.last_dirty_ratio == 0.0


async def test_many_channels_all_get_processed(autojump_clock):
    channels = [FakeChannel(str(n)) for n in range(100)]
    for n, channel in enumerate(channels):
        push_in_flight(channel, b"%d" % n, n, 0.05)
    scanner = scanner_for(channels)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await trio.sleep(0.15)
        # The first sample found 20 dirty out of 20: it looped at once, without waiting for the next tick.
        assert scanner.statistics().ticks == 1
        assert scanner.statistics().scans > 1
        await trio.sleep(2.0)
        nursery.cancel_scope.cancel()
    assert sorted(item for channel in channels for _, item in channel.moved) == list(range(100))


async def test_loops_at_once_while_more_than_dirty_percent_are_dirty(autojump_clock):
    channels = [DirtyFor(3, str(n)) for n in range(4)]
    scanner = scanner_for(channels)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        start = trio.current_time()
        await trio.sleep(0.25)
        nursery.cancel_scope.cancel()
    for channel in channels:
        # Three dirty samples and the clean one all at the first tick, then one per tick.
        assert [round(now - start, 6) for now in channel.calls] == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.2])
    stats = scanner.statistics()
    assert stats.scans == 5 and stats.ticks == 2 and stats.last_dirty_ratio == 0.0


async def test_exactly_dirty_percent_does_not_loop(autojump_clock):
    dirty = DirtyFor(3, "dirty")
    channels = [dirty, *(busy(FakeChannel(str(n))) for n in range(3))]
    scanner = scanner_for(channels)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        start = trio.current_time()
        await trio.sleep(0.35)
        assert scanner.statistics().last_dirty_ratio == 0.25
        nursery.cancel_scope.cancel()
    # 1 of 4 dirty is 25 %, not more than 25 %: one sample per tick.
    assert [round(now - start, 6) for now in dirty.calls] == pytest.approx([0.1, 0.2, 0.3])
    assert scanner.statistics().scans == 3


async def test_pool_size_follows_the_channel_count_and_the_max(autojump_clock):
    channels = []
    scanner = scanner_for(channels, worker_pool_max=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await wait_blocked()
        assert (scanner.statistics().pool_size, scanner.statistics().workers) == (1, 1)  # at least one
        for count, size in [(7, 1), (8, 2), (12, 3), (16, 4), (100, 4), (3, 1), (15, 3)]:
            channels[:] = [wire(scanner, FakeChannel(str(n))) for n in range(count)]
            scanner.refresh()
            await wait_blocked()
            stats = scanner.statistics()
            assert (stats.channels, stats.pool_size, stats.workers) == (count, size, size), count
        # Explicit resizes are clamped to [1, worker_pool_max].
        assert scanner.resize_pool(10) == 4
        await wait_blocked()
        assert scanner.statistics().workers == 4
        assert scanner.resize_pool(0) == 1
        await wait_blocked()
        assert scanner.statistics().workers == 1
        # Scanning still works after all that shrinking and growing.
        channels[0].deferred.push("x", trio.current_time())
        await trio.sleep(0.15)
        assert [item for _, item in channels[0].moved] == ["x"]
        nursery.cancel_scope.cancel()


async def test_periodic_refresh_picks_up_new_channels_and_resizes(autojump_clock):
    channels = [FakeChannel("first")]
    scanner = scanner_for(channels, refresh_interval=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        late = [busy(FakeChannel(str(n))) for n in range(11)]
        channels.extend(late)  # no refresh() call, and they did not tell: the periodic refresh must find them
        await trio.sleep(4.9)
        assert scanner.statistics().channels == 1 and not any(channel.calls for channel in late)
        assert scanner.statistics().refreshes == 1
        await trio.sleep(0.2)
        stats = scanner.statistics()
        assert stats.channels == 12 and stats.pool_size == 3 and stats.refreshes == 2
        await trio.sleep(0.2)
        assert all(channel.calls for channel in late)
        nursery.cancel_scope.cancel()


async def test_removed_channel_is_no_longer_scanned(autojump_clock):
    keep, gone = busy(FakeChannel("keep")), busy(FakeChannel("gone"))
    channels = [keep, gone]
    scanner = scanner_for(channels)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await trio.sleep(0.35)
        assert len(gone.calls) == 3
        channels.remove(gone)
        scanner.refresh()
        gone.in_flight.on_active = gone.deferred.on_active = None  # as nsqd's deleted channels, drained for good
        gone.deferred.push("orphan", 0.0)
        await trio.sleep(1.0)
        assert len(gone.calls) == 3 and gone.moved == []
        assert len(keep.calls) == 13
        nursery.cancel_scope.cancel()


async def test_invalidate_reloads_the_list_once_before_the_next_sample(autojump_clock):
    calls = []
    channels = [FakeChannel("first")]

    def listing():
        calls.append(len(channels))
        return channels

    scanner = QueueScanner(listing, rng=random.Random(42))
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await trio.sleep(0.15)
        late = [busy(FakeChannel(str(n))) for n in range(3)]
        for channel in late:  # a burst of creates: no reload each time
            channels.append(channel)
            scanner.invalidate()
        assert calls == [1]
        await trio.sleep(0.1)
        assert calls == [1, 4]  # reloaded once, at the next tick, and sampled at once
        assert all(channel.calls for channel in late)
        nursery.cancel_scope.cancel()


async def test_refresh_during_a_dirty_loop_takes_effect_at_once(autojump_clock):
    gone = DirtyFor(1000, "gone")
    channels = [gone]
    scanner = scanner_for(channels)

    class Remover(FakeChannel):
        """Dirty for its first 6 scans; removes `gone` from the list during the third."""

        def process_queues(self, now):
            super().process_queues(now)
            if len(self.calls) == 3:
                channels.remove(gone)
                scanner.refresh()
            return len(self.calls) <= 6

        def has_timed_work(self):
            return True

    remover = Remover("remover")
    channels.append(remover)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        start = trio.current_time()
        await trio.sleep(0.15)
        nursery.cancel_scope.cancel()
    # Samples 1-3 held both channels (the third was queued before the refresh); the loop went on without `gone`.
    assert len(gone.calls) == 3
    assert [round(now - start, 6) for now in remover.calls] == pytest.approx([0.1] * 7)


async def test_no_channels_no_scans(autojump_clock):
    scanner = scanner_for([])
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    stats = scanner.statistics()
    assert stats.scans == 0 and stats.ticks == 0


async def test_stops_cleanly_on_cancel_and_can_run_again(autojump_clock):
    channel = FakeChannel()
    scanner = scanner_for([busy(channel)] + [busy(FakeChannel(str(n))) for n in range(9)])
    with trio.move_on_after(0.55) as scope:
        await scanner.run()
    assert scope.cancelled_caught
    await wait_blocked()
    stats = scanner.statistics()
    assert stats.pool_size == 0 and stats.workers == 0 and stats.ticks == 5
    assert isinstance(stats, QueueScannerStatistics)
    assert scanner.resize_pool(3) == 3  # harmless while stopped
    assert scanner.statistics().workers == 0

    push_in_flight(channel, b"id", "again", trio.current_time() + 0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await wait_blocked()
        assert scanner.statistics().workers == 2
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    assert [item for _, item in channel.moved] == ["again"]
    await wait_blocked()
    assert scanner.statistics().workers == 0


async def test_run_twice_at_once_is_an_error(autojump_clock):
    scanner = scanner_for([])
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        with pytest.raises(RuntimeError):
            await scanner.run()
        nursery.cancel_scope.cancel()


async def test_process_queues_exception_propagates(autojump_clock):
    class Broken(FakeChannel):
        def process_queues(self, now):
            raise RuntimeError("boom")

    scanner = scanner_for([busy(Broken())])
    with pytest.raises(RuntimeError, match="boom"):
        try:
            await scanner.run()
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None


def test_invalid_arguments():
    for kwargs in [
        {"interval": 0},
        {"refresh_interval": -1},
        {"selection_count": 0},
        {"worker_pool_max": 0},
        {"dirty_percent": 1.5},
    ]:
        with pytest.raises(ValueError):
            QueueScanner(list, **kwargs)


def test_ideal_pool_size_is_nsqds_rule():
    scanner = QueueScanner(list, worker_pool_max=4)
    assert [scanner.ideal_pool_size(n) for n in (0, 1, 4, 7, 8, 11, 12, 16, 1000)] == [1, 1, 1, 1, 2, 2, 3, 4, 4]


async def test_only_channels_with_timed_work_are_scanned_and_each_tick_reaches_them(autojump_clock):
    # nsqd samples 20 of all its channels: with 2,000 channels, one with a message due waits 10 s on average.
    # Here idle channels are never sampled, and a channel that starts holding something is scanned at the next tick.
    channels = [FakeChannel(str(n)) for n in range(2000)]
    scanner = scanner_for(channels)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await trio.sleep(1.0)
        assert not any(channel.calls for channel in channels)
        assert scanner.statistics().ticks == 0 and scanner.statistics().active == 0
        start = trio.current_time()
        for n in (7, 1234, 1999):
            channels[n].deferred.push(("deferred", n), start + 0.01)
        push_in_flight(channels[500], b"m", ("timed out", 500), start + 0.02)
        assert scanner.statistics().active == 4
        await trio.sleep(0.1)
        assert sorted(item for channel in channels for _, item in channel.moved) == [
            ("deferred", 7),
            ("deferred", 1234),
            ("deferred", 1999),
            ("timed out", 500),
        ]
        assert sum(len(channel.calls) for channel in channels) == 4  # nobody else was looked at
        assert scanner.statistics().active == 0  # each left once it had nothing timed
        channels[7].deferred.push(("again", 7), trio.current_time() + 0.3)
        await trio.sleep(0.45)
        assert [item for _, item in channels[7].moved] == [("deferred", 7), ("again", 7)]
        nursery.cancel_scope.cancel()


async def test_nsqd_lists_its_channels_again_only_when_one_came_or_went(nsqd):
    """The scanner's refresh asks nsqd for its channels every few seconds: the same list comes back while no topic
    or channel was created or deleted, and a new one after any such change."""
    assert nsqd.all_channels() is nsqd.all_channels()
    alpha = nsqd.get_topic("t").get_channel("a")
    assert nsqd.all_channels() == [alpha]
    beta = nsqd.get_topic("u").get_channel("b")
    assert nsqd.all_channels() == [alpha, beta]
    nsqd.get_topic("t").delete_channel("a")
    assert nsqd.all_channels() == [beta]
    nsqd.delete_topic("u")
    assert nsqd.all_channels() == []


def test_a_refresh_looks_at_the_channels_new_to_the_list_only():
    """The channels a refresh knew tell when they get timed work (their queues are wired): the next refreshes do
    not look at them again, however many there are; a channel new to the list is looked at once."""
    looked_at = []

    class Counted(FakeChannel):
        def has_timed_work(self):
            looked_at.append(self.name)
            return super().has_timed_work()

    channels = [Counted(str(n)) for n in range(5)]
    scanner = scanner_for(channels)
    scanner.refresh()
    assert sorted(looked_at) == ["0", "1", "2", "3", "4"]
    looked_at.clear()
    scanner.refresh()
    assert looked_at == []
    channels.append(busy(Counted("new")))  # timed work from before it was listed: found
    scanner.refresh()
    assert looked_at == ["new"] and scanner.statistics().active == 1


class StepCounter(trio.abc.Instrument):
    """Counts the steps of every task but the test's own: how often anything else woke up."""

    def __init__(self, mine):
        self.mine = mine
        self.steps = 0

    def before_task_step(self, task):
        if task is not self.mine:
            self.steps += 1


async def test_an_idle_scanner_wakes_only_for_its_refresh(autojump_clock):
    # nsqd wakes every 100 ms whatever it holds: with no channel active, only the refresh (every 5 s) runs
    channels = [FakeChannel(str(n)) for n in range(3)]
    scanner = scanner_for(channels)
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        await wait_blocked()
        assert scanner.statistics().idle
        counter = StepCounter(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(counter)
        try:
            await trio.sleep(4.9)
            assert counter.steps == 0
            await trio.sleep(10.0)
            assert counter.steps == 2  # the refreshes at 5 s and 10 s, one step each
        finally:
            trio.lowlevel.remove_instrument(counter)
        stats = scanner.statistics()
        assert stats.ticks == 0 and stats.refreshes == 3 and stats.idle
        nursery.cancel_scope.cancel()


async def test_timed_work_after_an_idle_spell_comes_due_at_the_grids_next_tick(autojump_clock):
    # the ticks an idle scanner skipped are not run, but its next tick is the one it would have had: a deferred
    # message and an in-flight one that times out are moved at most an interval after they are due
    deferred, in_flight = FakeChannel("deferred"), FakeChannel("in flight")
    scanner = scanner_for([deferred, in_flight])
    async with trio.open_nursery() as nursery:
        await nursery.start(scanner.run)
        start = trio.current_time()
        await trio.sleep(12.345)
        assert scanner.statistics().idle
        now = trio.current_time()
        deferred.deferred.push("due", now + 0.03)
        push_in_flight(in_flight, b"late", "timed out", now + 0.25)
        assert not scanner.statistics().idle
        await trio.sleep(0.5)
        assert [item for _, item in deferred.moved] == ["due"]
        assert [item for _, item in in_flight.moved] == ["timed out"]
        (moved_at,) = (when for when, _ in deferred.moved)
        assert now + 0.03 <= moved_at <= now + 0.13
        (timed_out_at,) = (when for when, _ in in_flight.moved)
        assert now + 0.25 <= timed_out_at <= now + 0.35
        for when in (moved_at, timed_out_at):  # on the grid of the ticks from the start
            assert (when - start) / 0.1 == pytest.approx(round((when - start) / 0.1))
        await wait_blocked()
        assert scanner.statistics().idle and scanner.statistics().active == 0  # idle again, both queues empty
        nursery.cancel_scope.cancel()
