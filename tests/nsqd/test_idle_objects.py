"""What an idle channel and an idle connection hold for CPython's cyclic collector, which visits every object that
lives long at each full collection (0.5-0.7 s at 10,000 topics, 20,000 channels and 5,000 connections): a channel
shares the empty in-flight and deferred queues until it first delivers or defers a message, and its hooks are
shared by every channel; a connection's command table is its class's. What is made at first use works as before,
after a restart too."""

from __future__ import annotations

import gc
from types import MethodType

import trio

from nsqd.options import parse_options
from nsqd.queues.deferred import EMPTY_DEFERRED
from nsqd.queues.inflight import EMPTY_IN_FLIGHT
from nsqd.server import NSQD
from nsqd.stats import collect, json_body
from nsqd.stats_cache import StatsCache
from nsqd.tcp import Connection
from protocol.commands import MAGIC_V2, encode_dpub, encode_fin, encode_pub, encode_rdy, encode_req, encode_sub
from protocol.frames import FRAME_TYPE_MESSAGE, FrameDecoder
from protocol.message import decode_message

from .test_topic_setup import started_nsqd


def test_an_idle_channel_shares_its_empty_queues_and_holds_few_objects(tmp_path):
    nsqd = started_nsqd(tmp_path)
    topics = [nsqd.get_topic(f"idle_{n}") for n in range(500)]
    gc.collect()
    before = len(gc.get_objects())
    for topic in topics:
        topic.get_channel("c")
    gc.collect()
    # the channel, its dispatcher, its two deques, its disk queue and deferred index...: 16 with queues and hooks
    # of its own
    assert (len(gc.get_objects()) - before) / len(topics) < 10
    channel = topics[0].channels["c"]
    assert channel.in_flight is EMPTY_IN_FLIGHT and channel.deferred is EMPTY_DEFERRED
    # what reads or empties a channel works on the shared queues, and leaves them empty
    channel.process_queues(1e9)
    channel.empty()
    assert not channel.has_timed_work() and len(EMPTY_IN_FLIGHT) == 0 and len(EMPTY_DEFERRED) == 0


async def test_an_idle_connection_holds_no_table_of_its_own(tmp_path):
    async with trio.open_nursery() as nursery:
        nsqd = await _running(nursery, tmp_path)
        client = await _Client.open(nsqd)
        await client.send(encode_sub("t", "c") + encode_rdy(1))
        await client.response()
        gc.collect()
        connections = [o for o in gc.get_objects() if type(o) is Connection]
        assert len(connections) == 1
        methods = [o for o in gc.get_objects() if type(o) is MethodType and o.__self__ is connections[0]]
        # the client's direct flush and the parser's line check; 14 more with a table of bound methods
        assert sorted(m.__name__ for m in methods) == ["_flush_direct", "_line_check"]
        del connections, methods
        # a closed connection is counted as let go of (runtime/collector.py)
        await client.stream.aclose()
        while nsqd.clients:
            await trio.sleep(0.01)
        assert nsqd.collector.released == 1
        nsqd.exit()


async def _running(nursery, tmp_path, *flags: str) -> NSQD:
    opts = parse_options(
        ["--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={tmp_path}", *flags], exit_on_error=False
    )
    nsqd = NSQD(opts)
    await nursery.start(nsqd.run)
    return nsqd


def _assert_stats(nsqd: NSQD, cache: StatsCache) -> None:
    for options in ({}, {"include_clients": False}):
        assert cache.json(include_mem=False, **options) == json_body(collect(nsqd, include_mem=False, **options))


class _Client:
    def __init__(self, stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()

    @classmethod
    async def open(cls, nsqd: NSQD) -> _Client:
        host, port = nsqd.tcp_address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(MAGIC_V2)
        return cls(stream)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def frame(self):
        with trio.fail_after(10):
            while True:
                frame = self.decoder.next_frame()
                if frame is not None:
                    return frame
                data = await self.stream.receive_some(65536)
                assert data, "nsqd closed the connection"
                self.decoder.receive_data(data)

    async def response(self) -> bytes:
        frame = await self.frame()
        assert frame.frame_type != FRAME_TYPE_MESSAGE, frame
        return frame.data

    async def message(self):
        while True:
            frame = await self.frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                return decode_message(frame.data)


async def test_queues_made_at_first_use_wake_the_scanner_and_survive_a_restart(tmp_path):
    with trio.fail_after(30):
        await _first_use_and_restart(tmp_path)


async def _first_use_and_restart(tmp_path):
    async with trio.open_nursery() as nursery:
        nsqd = await _running(nursery, tmp_path, "--msg-timeout=200ms")
        client = await _Client.open(nsqd)
        await client.send(encode_sub("t", "c") + encode_pub("t", b"zero") + encode_pub("t", b"zero too"))
        for _ in range(3):
            assert await client.response() == b"OK"
        channel = nsqd.topics["t"].channels["c"]
        other = nsqd.topics["t"].get_channel("idle")
        assert channel.in_flight is EMPTY_IN_FLIGHT and channel.deferred is EMPTY_DEFERRED
        cache = StatsCache(nsqd)  # and the /stats the cache renders follows each step (the channels mark changes)
        _assert_stats(nsqd, cache)
        await client.send(encode_rdy(1))  # the dispatcher delivers what waited, in a slice of its own
        zero = await client.message()
        _assert_stats(nsqd, cache)
        await client.send(encode_fin(zero.id) + encode_rdy(10))
        await client.send(encode_fin((await client.message()).id))

        await client.send(encode_pub("t", b"one") + encode_pub("t", b"two"))
        first, _second = await client.message(), await client.message()
        assert channel.in_flight is not EMPTY_IN_FLIGHT and len(channel.in_flight) == 2
        assert other.in_flight is EMPTY_IN_FLIGHT  # the other channel's copies wait in its memory queue
        _assert_stats(nsqd, cache)
        # a requeue with a delay: the deferred queue is made, and the scanner brings the message back
        await client.send(encode_req(first.id, 20))
        assert (await client.message()).body == b"one"
        assert channel.deferred is not EMPTY_DEFERRED and len(channel.deferred) == 0
        _assert_stats(nsqd, cache)
        # the message left unfinished times out: the in-flight queue made at the first delivery woke the scanner
        again = await client.message()
        assert (again.body, again.attempts) == (b"two", 2)
        _assert_stats(nsqd, cache)
        await client.send(encode_fin(again.id))
        # a DPUB: deferred in both channels, delivered here after its delay
        await client.send(encode_dpub("t", 30, b"later"))
        while True:
            message = await client.message()
            if message.body == b"later":
                break
            await client.send(encode_fin(message.id))
        # in the other channel too, and back in its memory queue once due (the scanner was woken there as well)
        assert other.deferred is not EMPTY_DEFERRED
        while [m.body for m in other.queue] != [b"one", b"two", b"later"]:
            await trio.sleep(0.01)
        _assert_stats(nsqd, cache)
        # left in flight and deferred when the node stops: written to disk with the channel
        await client.send(encode_dpub("t", 60_000, b"much later"))
        await client.response()
        nsqd.exit()

    async with trio.open_nursery() as nursery:
        nsqd = await _running(nursery, tmp_path)
        channel = nsqd.topics["t"].channels["c"]
        client = await _Client.open(nsqd)
        await client.send(encode_sub("t", "c") + encode_rdy(10))
        assert await client.response() == b"OK"
        bodies = set()
        while b"later" not in bodies:
            message = await client.message()
            bodies.add(message.body)
            await client.send(encode_fin(message.id))
        # what waits for a later time is in a deferred queue made after the restart
        while channel.deferred is EMPTY_DEFERRED or len(channel.deferred) != 1:
            await trio.sleep(0.01)
        assert channel.deferred.entries()[0][1].body == b"much later"
        _assert_stats(nsqd, StatsCache(nsqd))
        nsqd.exit()
