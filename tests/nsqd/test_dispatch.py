"""The channel's dispatcher and FIN runs against a real Channel, without sockets: the frames a batch becomes
(byte for byte NSQ's), what goes in flight, the counters, and the outcome of each FIN of a run."""

import math
from itertools import pairwise

import pytest
import trio
import trio.testing

from nsqd import dispatch as dispatch_module
from nsqd.actors import ActorSystem
from nsqd.channel import Channel
from nsqd.client import Client, ClientState
from nsqd.dispatch import BATCH, DEADLINE_GRAIN, REFILL
from nsqd.message import Message
from nsqd.queues.diskqueue import DiskQueue
from protocol.message import encode_message_frame


class _Topic:
    name = "t"


def _channel() -> Channel:
    return Channel(
        _Topic(),
        "c",
        mem_queue_size=10_000,
        max_msg_timeout=900.0,
        actors=ActorSystem(),
        on_last_client_gone=lambda channel: None,
    )


def _consumer(channel: Channel, client_id: int, rdy: int, msg_timeout: float = 60.0) -> Client:
    client = Client(
        client_id,
        f"127.0.0.1:{40000 + client_id}",
        msg_timeout=msg_timeout,
        heartbeat_interval=30.0,
        output_buffer_size=16384,
        output_buffer_timeout=0.25,
    )
    client.state = ClientState.SUBSCRIBED
    client.channel = channel
    channel.add_client(client)
    client.rdy = rdy
    channel.client_credit_changed(client)
    return client


def _messages() -> list[Message]:
    # runs of one size, timestamp and attempts, and changes of each, as a frame header prefix is reused
    # only while all three stay the same
    specs = [(200, 1000, 0)] * 3 + [(5, 1000, 0), (200, 1000, 0), (200, 2000, 0), (200, 2000, 3), (200, 2000, 0)]
    return [
        Message(b"%016x" % n, bytes([97 + n]) * size, timestamp, attempts)
        for n, (size, timestamp, attempts) in enumerate(specs)
    ]


async def test_a_batch_goes_out_as_nsq_message_frames():
    channel = _channel()
    client = _consumer(channel, 1, rdy=100, msg_timeout=30.0)
    messages = _messages()
    expected_attempts = [m.attempts + 1 for m in messages]
    channel.put_many(messages)
    now = trio.current_time()
    channel.dispatcher.dispatch(math.inf)
    assert [m.attempts for m in messages] == expected_attempts
    wire = b"".join(client.out)
    assert wire == b"".join(encode_message_frame(m) for m in messages)
    assert client.out_bytes == len(wire)
    assert (client.in_flight, client.message_count) == (len(messages), len(messages))
    assert len(channel.in_flight) == len(messages)
    for m in messages:
        assert channel.in_flight.get(m.id) is m and m.client is client
        assert channel.in_flight.deadline(m.id) == pytest.approx(now + 30.0, abs=1.0)


async def test_the_batches_of_one_millisecond_share_a_deadline_never_early(autojump_clock):
    """A batch's deadline is its delivery time plus the timeout rounded up to ``DEADLINE_GRAIN``: the batches of
    a slice, and of two consumers with the same timeout, go into one bucket of the in-flight queue."""
    await trio.sleep(0.1234567)  # a time between two grains (the mock clock: no time passes in the slice)
    channel = _channel()
    first = _consumer(channel, 1, rdy=3 * BATCH, msg_timeout=30.0)
    second = _consumer(channel, 2, rdy=BATCH, msg_timeout=30.0)
    messages = [Message(b"%016x" % n, b"m", 1000) for n in range(4 * BATCH)]
    channel.put_many(messages)
    now = trio.current_time()
    channel.dispatcher.dispatch(math.inf)
    assert first.in_flight + second.in_flight == len(messages)
    deadlines = {channel.in_flight.deadline(m.id) for m in messages}
    assert len(deadlines) == 1
    (deadline,) = deadlines
    assert now + 30.0 <= deadline < now + 30.0 + DEADLINE_GRAIN
    assert len(channel.in_flight._heap) == 1
    assert channel.in_flight.pop_expired(now + 30.0 - DEADLINE_GRAIN) == []
    assert channel.in_flight.pop_expired(deadline) == messages


TWINS = [pytest.param(dispatch_module._deliver_frames, id="python")]
if dispatch_module.load_speedups() is not None and hasattr(dispatch_module.load_speedups(), "deliver_frames"):
    TWINS.append(pytest.param(dispatch_module.load_speedups().deliver_frames, id="c"))


@pytest.mark.parametrize("deliver", TWINS)
def test_deliver_frames_in_c_and_in_python(deliver):
    messages = _messages()
    messages.append(Message(b"%016x" % 99, memoryview(b"viewed"), 2000, 0))  # any sized body, as the Python twin
    owner = object()
    out: list = []
    assert deliver(messages, owner, 12.5, out) == sum(len(m.body) for m in messages)
    assert b"".join(out) == b"".join(encode_message_frame(m) for m in messages)
    assert all(m.client is owner and m.delivered_at == 12.5 for m in messages)
    assert [m.attempts for m in messages] == [1, 1, 1, 1, 1, 1, 4, 1, 1]
    prefixes = out[::3]
    assert [a is b for a, b in pairwise(prefixes)] == [True, True, False, False, False, False, False, False]
    assert deliver([], owner, 1.0, out) == 0 and len(out) == 27


async def test_batches_are_bounded_by_credit_and_each_consumer_gets_its_own_deadline():
    channel = _channel()
    fast = _consumer(channel, 1, rdy=3, msg_timeout=10.0)
    slow = _consumer(channel, 2, rdy=100, msg_timeout=600.0)
    messages = _messages()
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    assert fast.in_flight == 3 and slow.in_flight == len(messages) - 3
    mine = [m for m in messages if m.client is fast]
    theirs = [m for m in messages if m.client is slow]
    assert len(mine) == 3 and len(theirs) == len(messages) - 3
    assert channel.in_flight.pop_expired(trio.current_time() + 20.0) == mine


async def test_a_second_copy_of_a_message_in_flight_is_dropped():
    channel = _channel()
    client = _consumer(channel, 1, rdy=100)
    first = Message(b"0123456789abcdef", b"one", 1, 0)
    channel.put_many([first])
    channel.dispatcher.dispatch(math.inf)
    client.out.clear()
    copy = Message(b"0123456789abcdef", b"one", 1, 0)
    other = Message(b"fedcba9876543210", b"two", 1, 0)
    channel.put_many([copy, other])
    channel.dispatcher.dispatch(math.inf)
    assert b"".join(client.out) == encode_message_frame(other)
    assert client.in_flight == 2 and len(channel.in_flight) == 2 and not channel.queue
    assert channel.in_flight.get(first.id) is first


async def test_sampled_out_messages_are_consumed_without_delivery():
    channel = _channel()
    client = _consumer(channel, 1, rdy=100)
    client.sample_rate = 50
    draws = iter([0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.4, 0.6])  # <= 0.5 kept
    channel.dispatcher._random = lambda: next(draws)
    messages = _messages()
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    kept = messages[0::2]
    assert b"".join(client.out) == b"".join(encode_message_frame(m) for m in kept)
    assert client.in_flight == len(kept) and sorted(channel.in_flight) == sorted(m.id for m in kept)
    assert not channel.queue


async def test_finish_many_finishes_each_in_turn_and_reports_the_refused():
    channel = _channel()
    client = _consumer(channel, 1, rdy=4)
    other = _consumer(channel, 2, rdy=100)
    messages = _messages()
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    mine = [m.id for m in messages if m.client is client]
    theirs = next(m.id for m in messages if m.client is other)
    unknown = b"zzzzzzzzzzzzzzzz"
    refused = channel.finish_many(client, [mine[0], unknown, mine[1], mine[1], theirs, mine[2]])
    assert refused == [
        (unknown, "ID not in flight"),
        (mine[1], "ID not in flight"),
        (theirs, "client does not own message"),
    ]
    assert (client.in_flight, client.finish_count) == (1, 3)
    assert channel.in_flight.get(theirs) is not None and mine[3] in channel.in_flight
    assert client.in_mailbox and client in channel.mailbox  # the credit it got back puts it in the mailbox


async def test_finish_many_feeds_the_end_to_end_latency_window():
    channel = _channel()
    seen = []

    class Window:
        def add(self, timestamp):
            seen.append(timestamp)

    channel.e2e = Window()
    client = _consumer(channel, 1, rdy=100)
    messages = _messages()
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    assert channel.finish_many(client, [m.id for m in messages[:5]]) == []
    assert seen == [m.timestamp for m in messages[:5]]


def _channel_on(actors: ActorSystem) -> Channel:
    return Channel(
        _Topic(),
        "c",
        mem_queue_size=10_000,
        max_msg_timeout=900.0,
        actors=actors,
        on_last_client_gone=lambda channel: None,
    )


async def test_a_publish_to_a_quiet_channel_delivers_in_the_publishers_step():
    actors = ActorSystem()
    async with trio.open_nursery() as nursery:
        await nursery.start(actors.run)
        channel = _channel_on(actors)
        client = _consumer(channel, 1, rdy=10)
        await trio.testing.wait_all_tasks_blocked()
        message = Message(b"%016x" % 1, b"hello", 1000, 0)
        channel.put_many([message])
        # no checkpoint since the put: the frame is already in the consumer's buffer, the message in flight
        assert b"".join(client.out) == encode_message_frame(message)
        assert client.in_flight == 1 and channel.in_flight.get(message.id) is message
        assert actors.statistics().preempted == 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory backlog", "disk backlog"])
async def test_a_busy_slice_pauses_between_consumers_and_a_quiet_channel_delivers_meanwhile(tmp_path, on_disk):
    """With interludes due at every safe point, a long slice of a busy channel calls the system's hook between two
    consumers (and after each disk read): never with a consumer half served. A publish made there to a quiet
    channel is delivered at once, while the busy slice is still in progress. A disk backlog is read REFILL
    records at a time, with an interlude after each read, and still goes out in batches of BATCH."""
    actors = ActorSystem(slice_seconds=60.0, interlude_seconds=1e-9)
    backend = DiskQueue("busy", str(tmp_path)) if on_disk else None
    busy = Channel(
        _Topic(),
        "busy",
        mem_queue_size=0 if on_disk else 10_000,
        max_msg_timeout=900.0,
        actors=actors,
        on_last_client_gone=lambda channel: None,
        backend=backend,
    )
    quiet = _channel_on(actors)
    total = 20 * BATCH + 5
    seen = []
    quiet_message = Message(b"q" * 16, b"quiet", 1000, 0)

    def hook(below):
        assert below == busy.dispatcher.vruntime  # the paused channel's place in the fair order
        # each busy consumer's buffer holds exactly the frames of what it has in flight (3 pieces a message)
        assert all(len(client.out) == 3 * client.in_flight for client in (first, second))
        seen.append(first.in_flight + second.in_flight)
        if len(seen) == 2:
            quiet.put_many([quiet_message])
            assert quiet_client.in_flight == 1  # delivered inside the interlude
            assert b"".join(quiet_client.out) == encode_message_frame(quiet_message)

    async with trio.open_nursery() as nursery:
        await nursery.start(actors.run)
        first = _consumer(busy, 1, rdy=total)
        second = _consumer(busy, 2, rdy=total)
        quiet_client = _consumer(quiet, 3, rdy=10)
        await trio.testing.wait_all_tasks_blocked()
        actors.interlude_hook = hook
        messages = [Message(b"%016x" % n, b"m%d" % n, 1000, 0) for n in range(total)]
        busy.put_many(messages)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    if backend is not None:
        backend.close()
    assert first.in_flight + second.in_flight == total
    assert sorted(m.id for m in busy.in_flight.pop_expired(math.inf)) == sorted(m.id for m in messages)
    # one slice for it all (60 s), paused at safe points: after each consumer's turn of BATCH messages, and after
    # each disk read too; the quiet channel's message left at the second pause, with most of the backlog to go
    assert busy.dispatcher.slices <= 2
    assert len(seen) >= (total // BATCH) + (total // REFILL if on_disk else 0)
    assert seen == sorted(seen) and seen[1] < total
    steps = [after - before for before, after in pairwise([0, *seen]) if after != before]
    assert steps[:-1] == [BATCH] * (len(steps) - 1)  # whole batches, also when read from disk in smaller pieces
    if on_disk:
        assert REFILL < BATCH and seen.count(0) >= BATCH // REFILL  # the first batch's reads: paused after each
    assert quiet_client.in_flight == 1 and actors.statistics().preempted >= 1


async def test_consumers_that_leave_an_idle_channel_leave_its_mailbox():
    # the dispatcher drops a gone consumer when it comes up, but an idle channel's dispatcher does not run:
    # consumers that subscribe, send RDY and leave must not pile up there (each holds its connection)
    channel = _channel()
    staying = _consumer(channel, 1, rdy=10)
    for client_id in range(2, 200):
        client = _consumer(channel, client_id, rdy=5)
        client.rdy = 0  # as the daemon does when the connection ends
        client.channel = None
        channel.remove_client(client)
        assert not client.in_mailbox
    assert list(channel.mailbox) == [staying]
    messages = _messages()
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    assert staying.in_flight == len(messages)
