"""PUB producers through the poller step's batch (nsqd/fastpath.py), with nsqd's C accelerator and without it
(TRIONSQ_NO_SPEEDUPS=1): the same frames and the same messages as the general path, whatever the read holds.

One nsqd per mode for the module; every test runs against both."""

from __future__ import annotations

import struct
import threading
import uuid

import pytest

from tests.integration.harness import (
    FRAME_TYPE_RESPONSE,
    NOP,
    Frame,
    NsqdProcess,
    RawClient,
    consumer,
    dpub,
    fin,
    pub,
    stop_all,
)
from tests.integration.http_helpers import stats

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module", params=["accelerated", "python"])
def daemon(request, tmp_path_factory):
    process = NsqdProcess(tmp_path_factory.mktemp(f"nsqd-{request.param}"))
    if request.param == "python":
        process.env["TRIONSQ_NO_SPEEDUPS"] = "1"
    process.start()
    yield process
    stop_all([process])


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def topic_stats(daemon, name: str) -> dict:
    return next(t for t in stats(daemon.http(), f"topic={name}")["topics"] if t["topic_name"] == name)


def drain(daemon, name: str, count: int) -> list[bytes]:
    bodies = []
    with consumer(daemon.tcp, name, "c", ready=count) as client:
        for _ in range(count):
            message = client.read_message()
            bodies.append(message.body)
            client.send(fin(message.id))
    return bodies


def test_many_producers_one_pub_at_a_time(daemon):
    name = fresh()
    producers, each = 8, 60
    errors = []

    def produce(index: int) -> None:
        try:
            with RawClient(daemon.tcp) as client:
                for seq in range(each):
                    client.publish(name, b"%d-%d" % (index, seq))
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert topic_stats(daemon, name)["message_count"] == producers * each
    bodies = drain(daemon, name, producers * each)
    assert sorted(bodies) == sorted(b"%d-%d" % (i, s) for i in range(producers) for s in range(each))
    for index in range(producers):  # each producer's messages in its order
        mine = [body for body in bodies if body.startswith(b"%d-" % index)]
        assert mine == [b"%d-%d" % (index, s) for s in range(each)]


def test_pipelined_pubs_mixed_reads_and_a_dpub_on_the_same_line(daemon):
    name, other = fresh(), fresh()
    with RawClient(daemon.tcp) as client:
        client.publish(name, b"first")  # the line is checked once, by the parser
        client.send(pub(name, b"a") + pub(name, b"b") + pub(name, b"c"))  # one read of whole PUBs
        for _ in range(3):
            client.expect_ok()
        client.send(pub(name, b"d") + NOP + pub(other, b"e") + pub(name, b"f"))  # a read for the parser
        for _ in range(3):
            client.expect_ok()
        client.send(dpub(name, 60_000, b"later"))  # a DPUB after PUBs of the same topic keeps its delay
        client.expect_ok()
        data = pub(name, b"split")
        client.send(data[:7])  # a PUB across two reads
        client.send(data[7:])
        client.expect_ok()
    assert drain(daemon, name, 7) == [b"first", b"a", b"b", b"c", b"d", b"f", b"split"]
    assert topic_stats(daemon, other)["message_count"] == 1
    channel = topic_stats(daemon, name)["channels"][0]
    assert channel["deferred_count"] == 1


@pytest.mark.parametrize(
    "size, error",
    [
        (0, b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (1048577, b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
    ],
)
def test_a_bad_size_after_the_checked_line_is_the_general_paths_error(daemon, size, error):
    name = fresh()
    with RawClient(daemon.tcp) as client:
        client.publish(name, b"fine")
        client.send(f"PUB {name}\n".encode() + struct.pack(">i", size))
        client.expect_error(error)
    assert topic_stats(daemon, name)["message_count"] == 1


def test_a_producer_that_subscribes_gets_its_ok_before_the_message(daemon):
    name = fresh()
    with RawClient(daemon.tcp) as client:
        client.publish(name, b"before")
        client.subscribe(name, "mine", ready=10)
        assert client.read_message().body == b"before"
        client.send(pub(name, b"again"))
        assert client.read_frame() == Frame(FRAME_TYPE_RESPONSE, b"OK")  # the answer first, then the message
        assert client.read_message().body == b"again"
