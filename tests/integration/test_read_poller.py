"""Connections that wait in nsqd's read poller (nsqd/poller.py): every plain connection idle between commands is
read there, and goes back to its own task for what must await (IDENTIFY, its upgrades) or ends it (errors, EOF).
Each test first makes the connection idle (a PUB answered), so what follows arrives through the poller."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid

import pytest

from tests.integration.features import FeatureClient
from tests.integration.harness import (
    FRAME_TYPE_RESPONSE,
    NOP,
    Frame,
    RawClient,
    consumer,
    fin,
    identify,
    mpub,
    pub,
    rdy,
    sub,
)
from tests.integration.http_helpers import stats

pytestmark = pytest.mark.timeout(60)


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def topic_depth(daemon, name: str) -> int:
    return next(t["message_count"] for t in stats(daemon.http(), f"topic={name}")["topics"] if t["topic_name"] == name)


def test_identify_after_publishing_leaves_and_rejoins_the_poller(module_nsqd):
    name = fresh()
    with RawClient(module_nsqd.tcp) as client:
        client.publish(name, b"before")
        response = json.loads(client.identify({"feature_negotiation": True, "client_id": "polled"}))
        assert response["max_rdy_count"] == 2500
        client.publish(name, b"after")
        assert client.identify({"client_id": "again"}) == b"OK"  # a repeated IDENTIFY: plain OK
        client.publish(name, b"last")
    assert topic_depth(module_nsqd, name) == 3


def test_pipelined_commands_around_an_identify_keep_their_order(module_nsqd):
    name = fresh()
    with RawClient(module_nsqd.tcp) as client:
        client.publish(name, b"idle now")
        client.send(
            pub(name, b"a")
            + identify({"feature_negotiation": True})
            + pub(name, b"b")
            + NOP
            + mpub(name, [b"c", b"d"])
            + sub(name, "ch")
            + rdy(10)
        )
        client.expect_ok()
        assert json.loads(client.read_response())["version"]
        client.expect_ok()
        client.expect_ok()
        client.expect_ok()  # SUB
        bodies = sorted(client.read_message().body for _ in range(5))
    assert bodies == [b"a", b"b", b"c", b"d", b"idle now"]


def test_deflate_upgrade_after_publishing(module_nsqd):
    name = fresh()
    with FeatureClient(module_nsqd.tcp) as client:
        client.send(pub(name, b"clear"))
        client.expect_ok()
        response = client.identify({"feature_negotiation": True, "deflate": True, "deflate_level": 3})
        assert response["deflate"] is True
        client.start_deflate(3)
        client.send(pub(name, b"compressed" * 100))
        client.expect_ok()
        client.send(sub(name, "ch") + rdy(5))
        client.expect_ok()
        received = []
        for _ in range(2):
            message = client.read_message()
            received.append(message.body)
            client.send(fin(message.id))
    assert sorted(received) == [b"clear", b"compressed" * 100]


def test_fatal_error_from_the_poller_is_answered_then_closed(module_nsqd):
    with RawClient(module_nsqd.tcp) as client:
        client.publish(fresh(), b"x")
        client.send(b"BOGUS\n")
        client.expect_error(b"E_INVALID invalid command BOGUS")
        client.assert_closed()


def test_body_cut_by_eof_in_the_poller_is_reported(module_nsqd):
    name = fresh()
    with RawClient(module_nsqd.tcp) as client:
        client.publish(name, b"x")
        client.send(b"PUB " + name.encode() + b"\n\x00\x00\x00\x10abc")
        client.shutdown_write()
        client.expect_error(b"E_BAD_MESSAGE PUB failed to read message body")
        client.assert_closed()


def test_many_connections_publish_concurrently_and_one_leaving_does_not_disturb_the_rest(module_nsqd):
    name = fresh()
    clients = [RawClient(module_nsqd.tcp) for _ in range(40)]
    try:
        for client in clients:
            client.publish(name, b"warm")
        clients[7].close()  # leaves while the others sit in the poller
        errors: list[BaseException] = []

        def publish_all(client: RawClient) -> None:
            try:
                for i in range(50):
                    client.publish(name, b"m%d" % i)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=publish_all, args=(c,)) for i, c in enumerate(clients) if i != 7]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
    finally:
        for client in clients:
            client.close()
    assert topic_depth(module_nsqd, name) == 40 + 39 * 50


def test_heartbeat_read_deadline_applies_in_the_poller(module_nsqd):
    """A producer idle in the poller that stops answering heartbeats is closed by its read deadline."""
    with RawClient(module_nsqd.tcp) as client:
        assert client.identify({"heartbeat_interval": 1000}) == b"OK"
        client.publish(fresh(), b"x")
        seen = []
        with pytest.raises(Exception) as closed:
            while True:
                seen.append(client.read_frame(10, skip_heartbeats=False))
        assert type(closed.value).__name__ == "ConnectionClosed"
        assert seen and all(frame == Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_") for frame in seen)


def test_consumer_that_stops_reading_is_closed_by_its_write_deadline(nsqd):
    """The writer gives up after one heartbeat interval and stops the reading side, which waits in the poller.
    The consumer keeps sending NOPs, so only the write deadline can close it (not the read deadline)."""
    name = fresh()
    stalled = consumer(nsqd.tcp, name, "ch", ready=100, identify_fields={"heartbeat_interval": 1000})
    try:
        with RawClient(nsqd.tcp) as producer:
            for _ in range(10):  # 40 MB for a consumer that reads nothing: more than loopback buffers hold
                producer.publish_many(name, [b"x" * 1_000_000] * 4)
            deadline = time.monotonic() + 20
            while True:
                channel = next(
                    c
                    for t in stats(nsqd.http(), f"topic={name}")["topics"]
                    if t["topic_name"] == name
                    for c in t["channels"]
                )
                if not channel["clients"]:
                    break
                assert time.monotonic() < deadline, "a consumer that stopped reading was not closed"
                with contextlib.suppress(OSError):  # closed by the server meanwhile: the next look at /stats shows it
                    stalled.send(NOP)
                time.sleep(0.05)
            producer.publish(name, b"the daemon still serves")
    finally:
        stalled.close()
    nsqd.assert_running()


@pytest.mark.one_worker  # two channels of one process's scheduler (each worker has its own)
def test_single_messages_and_fins_read_inside_a_draining_channels_slices_lose_nothing(nsqd_factory):
    """A channel drains a disk backlog to a consumer that FINs in small writes while a producer publishes single
    messages to a quiet channel: with an interlude due at every safe point, the FINs, the PUBs and the quiet
    channel's deliveries run inside the busy channel's slices (nsqd/actors.py). Every message arrives once, in
    order on the quiet channel, and both channels end empty."""
    daemon = nsqd_factory("--actor-interlude=1ns", "--mem-queue-size=100")
    busy, quiet = fresh(), fresh()
    total = 40_000
    drain = consumer(daemon.tcp, busy, "drain", ready=0)
    with RawClient(daemon.tcp) as producer:
        for start in range(0, total, 1000):
            producer.publish_many(busy, [b"busy %d" % n for n in range(start, start + 1000)])
    listener = consumer(daemon.tcp, quiet, "live", ready=1)
    drained: list[bytes] = []
    errors: list[BaseException] = []

    def drain_all() -> None:
        try:
            drain.send(rdy(2500))
            owed = b""
            while len(drained) < total:
                message = drain.read_message(30)
                drained.append(message.body)
                owed += fin(message.id)
                if len(owed) >= 10 * len(fin(message.id)):  # a few FINs per write: a light connection
                    drain.send(owed)
                    owed = b""
            drain.send(owed)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=drain_all)
    thread.start()
    live: list[bytes] = []
    try:
        with RawClient(daemon.tcp) as producer:
            for n in range(300):
                producer.publish(quiet, b"live %d" % n)
                message = listener.read_message(30)
                live.append(message.body)
                listener.send(fin(message.id))
        thread.join(60)
        assert not thread.is_alive() and not errors, errors
    finally:
        drain.close()
        listener.close()
        thread.join(5)
    assert live == [b"live %d" % n for n in range(300)]
    assert sorted(drained) == sorted(b"busy %d" % n for n in range(total))
    deadline = time.monotonic() + 20
    while True:
        topics = {t["topic_name"]: t for t in stats(daemon.http())["topics"]}
        channels = [c for name in (busy, quiet) for c in topics[name]["channels"]]
        if all(c["depth"] == 0 and c["in_flight_count"] == 0 for c in channels):
            break
        assert time.monotonic() < deadline, channels
        time.sleep(0.05)
    assert [c["message_count"] for c in channels] == [total, 300]
    daemon.assert_running()
    assert daemon.stop() == 0
    found = re.search(
        r"channel scheduler ran (\d+) slices \((\d+) at once for a publish\) and (\d+) interludes", daemon.log_text()
    )
    assert found and int(found[3]) > 0, daemon.log_text()[-2000:]
