"""trionsq.Consumer end to end against real nsqd and nsqlookupd subprocesses: delivery, discovery, RDY spread and
rotation (read back from nsqd's /stats), backoff, max_attempts, a clean stop, reconnects and heartbeats.

The daemons' HTTP calls are blocking, so they run in a thread (``blocking``) and the consumer under test keeps
running meanwhile. Every wait polls a real condition with a deadline.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable

import pytest
import trio

from protocol.frames import CLOSE_WAIT_FRAME, OK_FRAME
from protocol.message import Message as WireMessage
from protocol.message import encode_message_frame, message_id_from_int
from tests.integration.harness import NsqdProcess, free_port
from tests.integration.http_helpers import post, stats
from tests.integration.lookupd_harness import wait_for_producers
from trionsq import Config, ConnectError, Message, NSQError
from trionsq._consumer import Consumer

pytestmark = pytest.mark.timeout(120)

CHANNEL = "ch"


async def blocking(fn: Callable, *args):
    return await trio.to_thread.run_sync(fn, *args)


def publish(nsqd: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    reply = post(nsqd.http(), f"/mpub?topic={topic}&binary=false", b"\n".join(bodies))
    assert reply.status == 200, reply


def channel_stats(nsqd: NsqdProcess, topic: str) -> dict | None:
    doc = stats(nsqd.http(), f"topic={topic}&channel={CHANNEL}")
    for item in doc["topics"] or []:
        for channel in item["channels"]:
            if channel["channel_name"] == CHANNEL:
                return channel
    return None


def ready_counts(nsqd: NsqdProcess, topic: str) -> list[int]:
    channel = channel_stats(nsqd, topic)
    return [client["ready_count"] for client in channel["clients"]] if channel else []


async def eventually(check: Callable, timeout: float = 20.0, message: str = "condition", interval: float = 0.05):
    """Poll ``check`` (sync and quick: it runs in the event loop) until it returns a true value."""
    with trio.move_on_after(timeout):
        while True:
            value = check()
            if value:
                return value
            await trio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value {check()!r}")


async def eventually_threaded(check: Callable, timeout: float = 20.0, message: str = "condition"):
    """``eventually`` for a blocking ``check`` (an HTTP call to a daemon): it runs in a thread."""
    with trio.move_on_after(timeout):
        while True:
            value = await blocking(check)
            if value:
                return value
            await trio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value {await blocking(check)!r}")


class Recorder:
    """A handler that records bodies; ``fail`` decides (body, attempts) -> raise."""

    def __init__(self, fail: Callable[[bytes, int], bool] = lambda body, attempts: False, delay: float = 0.0):
        self.fail = fail
        self.delay = delay
        self.bodies: list[bytes] = []
        self.attempts: list[tuple[bytes, int]] = []
        self.done: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        self.attempts.append((message.body, message.attempts))
        if self.delay:
            await trio.sleep(self.delay)
        if self.fail(message.body, message.attempts):
            raise RuntimeError(f"refusing {message.body!r}")
        self.done.append(message.body)


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


async def nsqds_with_a_message(nsqd_factory, topic: str, count: int) -> list[NsqdProcess]:
    """``count`` new nsqd, each holding one message ``x`` on ``topic``."""
    daemons = [nsqd_factory() for _ in range(count)]
    for daemon in daemons:
        await blocking(publish, daemon, topic, [b"x"])
    return daemons


async def test_consume_from_nsqd_addresses(nsqd, topic):
    sent = bodies(200)
    await blocking(publish, nsqd, topic, sent)
    handler = Recorder()
    config = Config(max_in_flight=25)
    async with Consumer(
        topic, CHANNEL, handler, config, nsqd_tcp_addresses=[nsqd.tcp_address], concurrency=4
    ) as consumer:
        await eventually(lambda: len(handler.done) >= len(sent), message="200 messages")
        assert consumer.stats().connections == 1
        assert await blocking(ready_counts, nsqd, topic) == [25]
    assert sorted(handler.done) == sorted(sent)
    stats_ = consumer.stats()
    assert (stats_.received, stats_.finished, stats_.requeued, stats_.in_flight) == (200, 200, 0, 0)
    channel = await eventually_threaded(
        lambda: (c := channel_stats(nsqd, topic)) and not c["clients"] and c, message="the consumer gone from nsqd"
    )
    assert (channel["depth"], channel["in_flight_count"], channel["requeue_count"]) == (0, 0, 0)


async def test_max_in_flight_spread_over_connections(nsqd_factory, topic):
    daemons = await nsqds_with_a_message(nsqd_factory, topic, 2)
    handler = Recorder()
    async with Consumer(
        topic, CHANNEL, handler, Config(max_in_flight=11), nsqd_tcp_addresses=[d.tcp_address for d in daemons]
    ) as consumer:
        assert consumer.stats().connections == 2
        for daemon in daemons:
            await eventually_threaded(lambda d=daemon: ready_counts(d, topic) == [5], message="RDY 5 on each nsqd")
        # a third connection lowers the others first: 11 // 3 = 3 each
        third = nsqd_factory()
        await blocking(publish, third, topic, [b"x"])
        await consumer._start_nsqd(third.tcp_address)
        for daemon in [*daemons, third]:
            await eventually_threaded(lambda d=daemon: ready_counts(d, topic) == [3], message="RDY 3 on each nsqd")
        await eventually(lambda: len(handler.done) == 3, message="one message from each")
        assert consumer.stats().total_rdy == 9


async def test_more_connections_than_max_in_flight_rotate(nsqd_factory, topic):
    daemons = [nsqd_factory() for _ in range(3)]
    for index, daemon in enumerate(daemons):
        await blocking(publish, daemon, topic, [f"from{index}".encode()])
    handler = Recorder()
    # go-nsq's rdy_redistribute_interval (5 s by default) and low_rdy_timeout, shortened
    config = Config(max_in_flight=1, low_rdy_idle_timeout=1.0, low_rdy_timeout=1.0, rdy_redistribute_interval=0.3)
    async with Consumer(topic, CHANNEL, handler, config, nsqd_tcp_addresses=[d.tcp_address for d in daemons]):
        # only one connection holds RDY 1 at any time
        counts = [await blocking(ready_counts, daemon, topic) for daemon in daemons]
        assert sorted(sum(counts, [])) == [0, 0, 1]
        # RDY 1 moves off the idle ones (every 0.3 s) until each nsqd delivered its message
        await eventually(
            lambda: sorted(handler.done) == [b"from0", b"from1", b"from2"],
            timeout=8,
            message="a message from each of three nsqd",
        )
        counts = [await blocking(ready_counts, daemon, topic) for daemon in daemons]
        assert sum(sum(counts, [])) <= 1


async def test_handler_failure_backs_off_then_recovers(nsqd, topic):
    # the first delivery of "bad" fails: RDY 0 for backoff_multiplier * 2 = 1 s, a trial RDY 1, then full RDY
    await blocking(publish, nsqd, topic, [b"bad"])
    handler = Recorder(fail=lambda body, attempts: body == b"bad" and attempts == 1)
    config = Config(max_in_flight=10, backoff_multiplier=0.5, default_requeue_delay=0.0)
    async with Consumer(topic, CHANNEL, handler, config, nsqd_tcp_addresses=[nsqd.tcp_address]) as consumer:
        await eventually(lambda: handler.attempts, message="the first delivery")
        await eventually(lambda: consumer.stats().backoff_level == 1, message="backoff level 1")
        await eventually_threaded(lambda: ready_counts(nsqd, topic) == [0], message="RDY 0 while backing off")
        # meanwhile nothing is delivered, even what is published now
        await blocking(publish, nsqd, topic, bodies(5))
        await trio.sleep(0.3)
        assert consumer.stats().received == 1
        # the trial gets "bad" again (attempt 2): it succeeds, and full RDY comes back
        await eventually(lambda: len(handler.done) == 6, message="all six messages")
        assert handler.attempts[1] == (b"bad", 2)
        await eventually_threaded(lambda: ready_counts(nsqd, topic) == [10], message="RDY 10 after recovering")
        stats_ = consumer.stats()
        assert (stats_.backoff_level, stats_.requeued, stats_.finished) == (0, 1, 6)
    channel = await blocking(channel_stats, nsqd, topic)
    assert channel["requeue_count"] == 1


async def test_requeue_without_backoff_keeps_rdy(nsqd, topic):
    await blocking(publish, nsqd, topic, [b"later"])

    async def handler(message: Message) -> None:
        if message.attempts == 1:
            message.requeue(0, backoff=False)

    async with Consumer(
        topic, CHANNEL, handler, Config(max_in_flight=4), nsqd_tcp_addresses=[nsqd.tcp_address]
    ) as consumer:
        await eventually(lambda: consumer.stats().finished == 1, message="the second delivery finished")
        stats_ = consumer.stats()
        assert (stats_.requeued, stats_.backoff_level, stats_.total_rdy) == (1, 0, 4)


async def test_max_attempts_gives_up(nsqd, topic, caplog):
    await blocking(publish, nsqd, topic, [b"poison", b"fine"])
    given_up: list[Message] = []
    handler = Recorder(fail=lambda body, attempts: body == b"poison")
    config = Config(max_in_flight=5, max_attempts=3, default_requeue_delay=0.0, max_backoff_duration=0.0)
    with caplog.at_level(logging.WARNING, logger="trionsq.consumer"):
        async with Consumer(
            topic, CHANNEL, handler, config, nsqd_tcp_addresses=[nsqd.tcp_address], on_give_up=given_up.append
        ) as consumer:
            await eventually(lambda: given_up, message="the give-up hook")
            await eventually(lambda: consumer.stats().finished == 2, message="both messages finished")
    assert [m.attempts for m in given_up] == [4] and given_up[0].body == b"poison"
    assert [a for body, a in handler.attempts if body == b"poison"] == [1, 2, 3]
    assert handler.done == [b"fine"]
    assert (consumer.stats().given_up, consumer.stats().requeued) == (1, 3)
    assert any("attempted 4 times, giving up" in record.getMessage() for record in caplog.records)
    channel = await blocking(channel_stats, nsqd, topic)
    assert (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 0, 0)


async def test_manual_responses(nsqd, topic):
    await blocking(publish, nsqd, topic, bodies(3))
    held: list[Message] = []

    async def handler(message: Message) -> None:
        message.disable_auto_response()
        message.touch()
        held.append(message)

    async with Consumer(
        topic, CHANNEL, handler, Config(max_in_flight=3), nsqd_tcp_addresses=[nsqd.tcp_address]
    ) as consumer:
        await eventually(lambda: len(held) == 3, message="three held messages")
        assert consumer.stats().in_flight == 3 and consumer.stats().finished == 0
        channel = await blocking(channel_stats, nsqd, topic)
        assert channel["in_flight_count"] == 3
        for message in held:
            message.finish()
        assert consumer.stats().in_flight == 0 and consumer.stats().finished == 3
        await eventually_threaded(
            lambda: channel_stats(nsqd, topic)["clients"][0]["finish_count"] == 3, message="three FINs at nsqd"
        )


async def test_stop_with_messages_in_flight_loses_nothing(nsqd, topic):
    sent = bodies(60)
    await blocking(publish, nsqd, topic, sent)
    first = Recorder(delay=0.05)
    config = Config(max_in_flight=20)
    async with Consumer(
        topic, CHANNEL, first, config, nsqd_tcp_addresses=[nsqd.tcp_address], concurrency=2, stop_timeout=0.3
    ) as consumer:
        await eventually(lambda: len(first.done) >= 10, message="ten handled")
    stopped = consumer.stats()
    assert stopped.connections == 0 and stopped.in_flight == 0
    assert stopped.received == stopped.finished + stopped.requeued
    assert stopped.requeued > 0  # more were delivered than handled in 0.3 s: those went back
    channel = await eventually_threaded(
        lambda: (c := channel_stats(nsqd, topic)) and not c["clients"] and c, message="the consumer gone from nsqd"
    )
    assert channel["in_flight_count"] == 0
    assert channel["depth"] == len(sent) - len(first.done)

    second = Recorder()
    async with Consumer(topic, CHANNEL, second, Config(max_in_flight=50), nsqd_tcp_addresses=[nsqd.tcp_address]):
        await eventually(lambda: len(first.done) + len(second.done) >= len(sent), message="all messages")
    assert Counter(first.done + second.done) == Counter(sent)  # each exactly once: FIN'd once, none lost


async def test_stop_lets_running_handlers_finish_and_puts_the_rest_back_at_once(nsqd, topic):
    # The handler's side effect (a publish, an HTTP request) comes first, then it waits for its outcome. A stop
    # must neither cancel it after the effect and REQ its message (the effect would happen twice) nor start
    # handlers for messages still waiting: those go back to nsqd at once.
    sent = bodies(20)
    await blocking(publish, nsqd, topic, sent)
    effects: list[bytes] = []
    busy = trio.Event()

    async def handler(message: Message) -> None:
        effects.append(message.body)
        busy.set()
        await trio.sleep(0.2)

    async with Consumer(
        topic, CHANNEL, handler, Config(max_in_flight=20), nsqd_tcp_addresses=[nsqd.tcp_address], stop_timeout=0.5
    ) as consumer:
        await eventually(lambda: consumer.stats().received == len(sent), message="all delivered")
        await busy.wait()
        started = trio.current_time()
    took = trio.current_time() - started
    stopped = consumer.stats()
    assert len(effects) == 1  # the one handler running when the stop began, and no other
    assert (stopped.finished, stopped.requeued, stopped.in_flight) == (1, len(sent) - 1, 0)
    assert took < 0.45  # the handler's 0.2 s, not the stop_timeout
    channel = await eventually_threaded(
        lambda: (c := channel_stats(nsqd, topic)) and not c["clients"] and c, message="the consumer gone from nsqd"
    )
    assert (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (len(sent) - 1, 0, 0)

    async def quick(message: Message) -> None:
        effects.append(message.body)

    async with Consumer(topic, CHANNEL, quick, Config(max_in_flight=50), nsqd_tcp_addresses=[nsqd.tcp_address]):
        await eventually(lambda: len(effects) >= len(sent), message="the rest")
    assert Counter(effects) == Counter(sent)  # every side effect exactly once


async def test_stop_cancels_a_handler_that_outlives_stop_timeout(nsqd, topic):
    await blocking(publish, nsqd, topic, [b"slow"])
    running, cancelled = trio.Event(), trio.Event()

    async def handler(message: Message) -> None:
        running.set()
        try:
            await trio.sleep(30)
        except trio.Cancelled:
            cancelled.set()
            raise

    async with Consumer(
        topic, CHANNEL, handler, Config(max_in_flight=5), nsqd_tcp_addresses=[nsqd.tcp_address], stop_timeout=0.3
    ) as consumer:
        # the handler itself, not only the delivery (counted on arrival): a message still queued when the stop
        # begins is requeued without a handler
        with trio.fail_after(20):
            await running.wait()
        started = trio.current_time()
    assert trio.current_time() - started < 5 and cancelled.is_set()
    assert (consumer.stats().requeued, consumer.stats().in_flight) == (1, 0)
    channel = await eventually_threaded(
        lambda: (c := channel_stats(nsqd, topic)) and not c["clients"] and c, message="the consumer gone from nsqd"
    )
    assert (channel["depth"], channel["requeue_count"]) == (1, 1)


async def test_messages_that_come_with_close_wait_are_put_back(fake_nsqd):
    # A stalled nsqd (a loaded machine, a SIGSTOP) reads the stop's RDY 0 and CLS late, after it queued more
    # messages for this connection: they arrive in the same read as CLOSE_WAIT. The consumer REQs them at once, and
    # those REQs must leave before the socket closes, or nsqd holds the messages in flight until its --msg-timeout.
    # After that read, trio runs the connection's writer and the task closing it in either order: several rounds.
    late = [message_id_from_int(n) for n in range(3)]
    rounds: list[tuple[trio.Event, bytearray]] = []

    async def stalled(stream, rest: bytes) -> None:
        done, data = rounds[-1]
        data += rest
        await stream.send_all(OK_FRAME)  # IDENTIFY
        for command, reply in ((b"SUB ", OK_FRAME), (b"CLS\n", b"")):
            while command not in data:
                data += await stream.receive_some(65536)
            if reply:
                await stream.send_all(reply)
        await stream.send_all(
            b"".join(encode_message_frame(WireMessage(msg_id, b"late", 1, 1)) for msg_id in late) + CLOSE_WAIT_FRAME
        )
        while chunk := await stream.receive_some(65536):  # until the consumer closes its socket
            data += chunk
        done.set()

    async def handler(message: Message) -> None:
        raise AssertionError("a message that came after the stop began reached the handler")

    address = await fake_nsqd(stalled)
    for _ in range(10):
        done, data = trio.Event(), bytearray()
        rounds.append((done, data))
        async with Consumer("t", CHANNEL, handler, Config(max_in_flight=5), nsqd_tcp_addresses=address) as consumer:
            pass
        with trio.fail_after(5):
            await done.wait()
        assert (consumer.stats().received, consumer.stats().requeued) == (3, 3)
        assert [msg_id for msg_id in late if b"REQ " + msg_id + b" 0\n" in data] == late


async def test_is_starved_as_go_nsq(nsqd, topic):
    # starved: some connection has messages in flight and at least 85% of its RDY count in flight
    held: list[Message] = []

    async def handler(message: Message) -> None:
        message.disable_auto_response()
        held.append(message)

    async with Consumer(
        topic, CHANNEL, handler, Config(max_in_flight=10), nsqd_tcp_addresses=[nsqd.tcp_address]
    ) as consumer:
        assert not consumer.is_starved()  # nothing in flight
        await blocking(publish, nsqd, topic, bodies(7))
        await eventually(lambda: len(held) == 7, message="seven held")
        assert not consumer.is_starved()  # 7 < int(10 * 0.85)
        await blocking(publish, nsqd, topic, [b"eighth"])
        await eventually(lambda: len(held) == 8, message="eight held")
        assert consumer.is_starved()
        held.pop().finish()
        assert not consumer.is_starved()
        consumer.set_max_in_flight(8)  # RDY 8: 7 in flight reach int(8 * 0.85) = 6
        assert consumer.is_starved()
        for message in held:
            message.finish()
        assert not consumer.is_starved()


async def test_set_max_in_flight_changes_rdy_at_nsqd(nsqd_factory, topic):
    daemons = await nsqds_with_a_message(nsqd_factory, topic, 2)
    handler = Recorder()
    # the redistribution's timings at their minimum: the last step waits for RDY to move to the busy connection
    config = Config(max_in_flight=10, low_rdy_idle_timeout=1.0, rdy_redistribute_interval=0.1)
    async with Consumer(
        topic, CHANNEL, handler, config, nsqd_tcp_addresses=[d.tcp_address for d in daemons]
    ) as consumer:
        for max_in_flight, expected in ((None, 5), (4, 2), (0, 0), (15, 7)):  # max(1, n // 2) each
            if max_in_flight is not None:
                consumer.set_max_in_flight(max_in_flight)
            for daemon in daemons:
                await eventually_threaded(
                    lambda d=daemon, n=expected: ready_counts(d, topic) == [n], message=f"RDY {expected} on each nsqd"
                )
            assert consumer.stats().total_rdy == 2 * expected
        await eventually(lambda: len(handler.done) == 2, message="both messages")
        # paused: nothing is delivered until the window opens again
        consumer.set_max_in_flight(0)
        for daemon in daemons:
            await eventually_threaded(lambda d=daemon: ready_counts(d, topic) == [0], message="RDY 0")
        await blocking(publish, daemons[0], topic, [b"later"])
        await trio.sleep(0.3)
        assert len(handler.done) == 2
        consumer.set_max_in_flight(1)  # fewer than connections: one of them gets RDY 1
        await eventually(lambda: len(handler.done) == 3, timeout=15, message="the message after the pause")


async def test_async_give_up_hook(nsqd, topic):
    await blocking(publish, nsqd, topic, [b"poison"])
    seen: list[tuple[bytes, int, bool]] = []

    async def on_give_up(message: Message) -> None:
        await trio.sleep(0.05)  # an async hook is awaited before the message is FIN'd
        seen.append((message.body, message.attempts, message.has_responded))

    handler = Recorder(fail=lambda body, attempts: True)
    config = Config(max_in_flight=1, max_attempts=2, default_requeue_delay=0.0, max_backoff_duration=0.0)
    async with Consumer(
        topic, CHANNEL, handler, config, nsqd_tcp_addresses=[nsqd.tcp_address], on_give_up=on_give_up
    ) as consumer:
        await eventually(
            lambda: consumer.stats().given_up == 1 and consumer.stats().finished == 1, message="given up and FIN'd"
        )
    assert seen == [(b"poison", 3, False)]
    assert [attempts for _, attempts in handler.attempts] == [1, 2]
    channel = await blocking(channel_stats, nsqd, topic)
    assert (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 0, 0)


async def test_local_addr_binds_the_connection(nsqd, topic):
    # go-nsq's local_addr: the connection comes from that address (127.0.0.2 is loopback too on Linux)
    config = Config()
    config.set("local_addr", "127.0.0.2:0")
    async with Consumer(topic, CHANNEL, Recorder(), config, nsqd_tcp_addresses=[nsqd.tcp_address]):
        channel = await eventually_threaded(
            lambda: (c := channel_stats(nsqd, topic)) and c["clients"] and c, message="the client at nsqd"
        )
    assert channel["clients"][0]["remote_address"].startswith("127.0.0.2:")


async def test_lookupd_queries_carry_the_auth_secret(topic):
    # go-nsq sends auth_secret to nsqlookupd as a bearer token unless skip_lookupd_authorization is false
    heads: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
        heads.append(data.lower())
        body = b'{"channels": [], "producers": []}'
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        lookupd = f"127.0.0.1:{listener.socket.getsockname()[1]}"
        for skip, expected in (("true", b"authorization: bearer s3cret\r\n"), ("false", None)):
            heads.clear()
            config = Config(auth_secret="s3cret")
            config.set("skip_lookupd_authorization", skip)
            async with Consumer(topic, CHANNEL, Recorder(), config, lookupd_http_addresses=[lookupd]):
                pass
            assert len(heads) == 1
            if expected:
                assert expected in heads[0]
            else:
                assert b"authorization" not in heads[0]
        nursery.cancel_scope.cancel()


async def test_reconnects_after_nsqd_restart(tmp_path, topic):
    port = free_port()
    args = [f"--tcp-address=127.0.0.1:{port}"]
    nsqd = NsqdProcess(tmp_path / "data", args).start()
    try:
        await blocking(publish, nsqd, topic, [b"before"])
        handler = Recorder()
        async with Consumer(
            topic,
            CHANNEL,
            handler,
            Config(max_in_flight=5, lookupd_poll_interval=2.0),
            nsqd_tcp_addresses=[f"127.0.0.1:{port}"],
        ) as consumer:
            await eventually(lambda: handler.done == [b"before"], message="the first message")
            assert await blocking(nsqd.stop) == 0
            await eventually(lambda: consumer.stats().connections == 0, message="the connection lost")
            nsqd = NsqdProcess(tmp_path / "data", args).start()
            await eventually(lambda: consumer.stats().connections == 1, message="reconnected")
            await blocking(publish, nsqd, topic, [b"after"])
            await eventually(lambda: handler.done == [b"before", b"after"], message="a message after the restart")
            assert await blocking(ready_counts, nsqd, topic) == [5]
    finally:
        if nsqd.is_running():
            nsqd.stop()


async def test_heartbeats_keep_the_connection(nsqd, topic):
    handler = Recorder()
    config = Config(max_in_flight=1, heartbeat_interval=1.0, read_timeout=1.5)
    async with Consumer(topic, CHANNEL, handler, config, nsqd_tcp_addresses=[nsqd.tcp_address]) as consumer:
        connected = await blocking(channel_stats, nsqd, topic)
        (client,) = connected["clients"]
        await trio.sleep(4.5)  # several heartbeat intervals, longer than read_timeout
        (still,) = (await blocking(channel_stats, nsqd, topic))["clients"]
        assert still["remote_address"] == client["remote_address"] and still["connect_ts"] == client["connect_ts"]
        assert consumer.stats().connections == 1
        await blocking(publish, nsqd, topic, [b"alive"])
        await eventually(lambda: handler.done == [b"alive"], message="a message after the heartbeats")


async def test_discovery_joins_new_nsqd_and_drops_gone_ones(cluster, topic):
    (lookupd,) = cluster.lookupds
    first = cluster.nsqds[0]
    await blocking(publish, first, topic, [b"one"])
    await blocking(wait_for_producers, lookupd, topic, {first.tcp[1]})
    handler = Recorder()
    config = Config(max_in_flight=10, lookupd_poll_interval=0.5)
    lookupd_address = "{}:{}".format(*lookupd.http_address)
    async with Consumer(topic, CHANNEL, handler, config, lookupd_http_addresses=[lookupd_address]) as consumer:
        assert consumer.stats().connections == 1  # lookupd's first answer was joined before the block
        await eventually(lambda: handler.done == [b"one"], message="the first nsqd's message")

        second = await blocking(cluster.start_nsqd)
        await blocking(publish, second, topic, [b"two"])
        await eventually(lambda: consumer.stats().connections == 2, message="the second nsqd joined")
        await eventually(lambda: sorted(handler.done) == [b"one", b"two"], message="the second nsqd's message")
        for daemon in (first, second):
            await eventually_threaded(lambda d=daemon: ready_counts(d, topic) == [5], message="RDY 5 on each")

        # the second goes away: it is dropped and the first gets the whole max_in_flight back
        assert await blocking(second.stop) == 0
        cluster.daemons.remove(second)
        await eventually(lambda: consumer.stats().connections == 1, message="the second nsqd dropped")
        await eventually_threaded(lambda: ready_counts(first, topic) == [10], message="RDY 10 on the first")


async def test_lookupd_tombstone_drops_a_live_nsqd(cluster, topic):
    (lookupd,) = cluster.lookupds
    nsqds = [cluster.nsqds[0], await blocking(cluster.start_nsqd)]
    for daemon in nsqds:
        await blocking(publish, daemon, topic, [b"x"])
    await blocking(wait_for_producers, lookupd, topic, {d.tcp[1] for d in nsqds})
    config = Config(max_in_flight=4, lookupd_poll_interval=0.5)
    handler = Recorder()
    async with Consumer(
        topic, CHANNEL, handler, config, lookupd_http_addresses=["{}:{}".format(*lookupd.http_address)]
    ) as consumer:
        assert consumer.stats().connections == 2
        gone = nsqds[1]
        node = f"127.0.0.1:{gone.listening['HTTP'][1]}"
        reply = await blocking(post, lookupd.http_address, f"/topic/tombstone?topic={topic}&node={node}")
        assert reply.status == 200
        # still running, but no longer listed: drained and closed (CLS), not reconnected
        await eventually(lambda: consumer.stats().connections == 1, message="the tombstoned nsqd dropped")
        await eventually_threaded(lambda: ready_counts(gone, topic) == [], message="no client left on it")
        await eventually_threaded(lambda: ready_counts(nsqds[0], topic) == [4], message="RDY 4 on the other")


def test_bad_arguments_are_clear():
    async def handler(message):
        pass

    with pytest.raises(ValueError, match="invalid topic name 'a b'"):
        Consumer("a b", CHANNEL, handler, nsqd_tcp_addresses=["127.0.0.1:4150"])
    with pytest.raises(ValueError, match="invalid channel name"):
        Consumer("t", "", handler, nsqd_tcp_addresses=["127.0.0.1:4150"])
    with pytest.raises(ValueError, match="at least one nsqd TCP address or nsqlookupd HTTP address"):
        Consumer("t", CHANNEL, handler)
    with pytest.raises(ValueError, match="invalid nsqd address 'localhost'"):
        Consumer("t", CHANNEL, handler, nsqd_tcp_addresses=["localhost"])
    with pytest.raises(ValueError, match="bad nsqlookupd HTTP address 'ftp://x'"):
        Consumer("t", CHANNEL, handler, lookupd_http_addresses=["ftp://x"])
    with pytest.raises(ValueError, match="concurrency"):
        Consumer("t", CHANNEL, handler, nsqd_tcp_addresses="127.0.0.1:4150", concurrency=0)


async def test_unreachable_nsqd_fails_fast_or_is_retried(topic):
    port = free_port()
    handler = Recorder()
    with trio.fail_after(10):
        with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
            async with Consumer(topic, CHANNEL, handler, nsqd_tcp_addresses=[f"127.0.0.1:{port}"]):
                raise AssertionError("not reached")

        async with Consumer(
            topic,
            CHANNEL,
            handler,
            Config(lookupd_poll_interval=1.0),
            nsqd_tcp_addresses=[f"127.0.0.1:{port}"],
            fail_fast=False,
        ) as consumer:
            assert consumer.stats().connections == 0
            await trio.sleep(0.6)  # a few redials (0.25 s, 0.5 s) without an error escaping
        assert consumer.stats().connections == 0


async def test_refused_subscribe_is_raised(nsqd_factory, topic):
    nsqd = nsqd_factory("--max-channel-consumers=1")
    handler = Recorder()
    with trio.fail_after(10):
        async with Consumer(topic, CHANNEL, handler, nsqd_tcp_addresses=[nsqd.tcp_address]) as first:
            with pytest.raises(NSQError, match="E_SUB_FAILED SUB failed consumers for .* exceeds limit of 1"):
                async with Consumer(topic, CHANNEL, handler, nsqd_tcp_addresses=[nsqd.tcp_address]):
                    raise AssertionError("not reached")
            assert first.stats().connections == 1
