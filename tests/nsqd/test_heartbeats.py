"""HeartbeatTimer on trio's MockClock: every scheduled client gets a heartbeat each interval, from one task;
IDENTIFY's new interval restarts the ticker, a cancelled client gets no more, and a disabled interval none."""

from __future__ import annotations

import contextlib

import trio

from nsqd.client import Client
from nsqd.heartbeats import HeartbeatTimer
from protocol.frames import HEARTBEAT_FRAME


@contextlib.asynccontextmanager
async def running_timer():
    """A running HeartbeatTimer and the time it started; stopped at the end of the block."""
    timer = HeartbeatTimer()
    async with trio.open_nursery() as nursery:
        await nursery.start(timer.run)
        yield timer, trio.current_time()
        nursery.cancel_scope.cancel()


class Recorder:
    """What the timer needs of a client: ``write_frame_now``; records when each frame came."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def write_frame_now(self, frame: bytes) -> None:
        assert frame == HEARTBEAT_FRAME
        self.times.append(trio.current_time())


async def test_each_client_ticks_at_its_interval(autojump_clock):
    fast, slow, silent = Recorder(), Recorder(), Recorder()
    async with running_timer() as (timer, start):
        timer.schedule(slow, 30.0)
        timer.schedule(fast, 1.0)
        timer.schedule(silent, 0)  # heartbeats disabled
        await trio.sleep(61.5)
    assert [round(t - start, 6) for t in slow.times] == [30.0, 60.0]
    assert [round(t - start, 6) for t in fast.times] == [float(n) for n in range(1, 62)]
    assert silent.times == [] and timer.sent == 63


async def test_reschedule_and_cancel(autojump_clock):
    client, gone = Recorder(), Recorder()
    async with running_timer() as (timer, start):
        timer.schedule(client, 30.0)
        timer.schedule(gone, 5.0)
        await trio.sleep(12.0)
        timer.schedule(client, 2.0)  # IDENTIFY asked for 2 s: the 30 s tick is dropped
        timer.cancel(gone)  # the connection ended
        await trio.sleep(7.0)
        assert len(timer) == 1
    assert [round(t - start, 6) for t in client.times] == [14.0, 16.0, 18.0]
    assert [round(t - start, 6) for t in gone.times] == [5.0, 10.0]


async def test_a_heartbeat_leaves_at_once_when_the_connection_can():
    """The timer writes through the connection's direct flush (plain TCP, no write under way): the connection's
    writer task is not woken; when the connection cannot (TLS, a write under way), its writer sends it."""
    client = Client(
        1,
        "127.0.0.1:1",
        msg_timeout=60.0,
        heartbeat_interval=30.0,
        output_buffer_size=16384,
        output_buffer_timeout=0.25,
    )
    sent = []

    def direct_flush() -> bool:
        sent.append(client.take_output())
        return True

    client.direct_flush = direct_flush
    wakeup = client.writer_wait_event()
    client.write_frame_now(HEARTBEAT_FRAME)
    assert sent == [HEARTBEAT_FRAME] and not client.out and not wakeup.is_set()
    client.direct_flush = lambda: False
    client.write_frame_now(HEARTBEAT_FRAME)
    assert wakeup.is_set() and client.flush_now and client.take_output() == HEARTBEAT_FRAME


async def test_heartbeats_due_close_together_go_at_one_wake_up_each_on_its_own_ticker(autojump_clock):
    first, close, apart = Recorder(), Recorder(), Recorder()
    async with running_timer() as (timer, start):
        timer.schedule(first, 10.0)
        await trio.sleep(0.05)
        timer.schedule(close, 10.0)  # due 0.05 s after the first: written with it, a little early
        await trio.sleep(0.45)
        timer.schedule(apart, 10.0)  # due 0.5 s after: a wake-up of its own
        await trio.sleep(25.0)
    assert [round(t - start, 6) for t in first.times] == [10.0, 20.0]
    assert [round(t - start, 6) for t in close.times] == [10.0, 20.0]  # due at 10.05 and 20.05: no drift
    assert [round(t - start, 6) for t in apart.times] == [10.5, 20.5]


async def test_an_interval_under_the_batch_window_sends_one_heartbeat_per_wake_up(autojump_clock):
    client = Recorder()
    async with running_timer() as (timer, start):
        timer.schedule(client, 0.04)
        await trio.sleep(0.5)
    times = [round(t - start, 6) for t in client.times]
    assert times and len(times) == len(set(times)) and len(times) <= 13, times


async def test_ended_connections_are_let_go_of_before_their_next_heartbeat_was_due(autojump_clock):
    # a flood of short connections: each ended one's entry would hold its objects for a whole interval
    import gc
    import weakref

    from nsqd.heartbeats import STALE_MIN

    kept = [Recorder() for _ in range(10)]
    async with running_timer() as (timer, start):
        for client in kept:
            timer.schedule(client, 30.0)
        ended = []
        for _ in range(10 * STALE_MIN):
            client = Recorder()
            timer.schedule(client, 30.0)
            timer.schedule(client, 15.0)  # IDENTIFY's interval: the first entry is stale at once
            ended.append(weakref.ref(client))
            timer.cancel(client)
            del client
            assert len(timer._heap) <= len(kept) + 2 * STALE_MIN + 2
        gc.collect()
        assert sum(ref() is not None for ref in ended) <= STALE_MIN
        await trio.sleep(31)
    assert all([round(t - start, 6) for t in client.times] == [30.0] for client in kept)
    assert timer.sent == len(kept)
