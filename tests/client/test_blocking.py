"""trionsq.blocking against real nsqd (and nsqlookupd) subprocesses: publishing on one connection and through the
pipelined Producer, its fail-over, nsqd's errors, TLS, snappy, deflate, AUTH, heartbeats, the raw read loop, the
lookupd helpers, and that none of it (nor the Spark connector built on it) imports trio.

Plain synchronous tests: the driver under test blocks, and the daemons are subprocesses. A scripted listener stands
in for nsqd only where nsqd cannot be made to fail on demand (E_PUB_FAILED, a reply that never comes).
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from protocol.commands import encode_mpub, encode_pub
from protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, encode_frame
from tests.client.conftest import nsqd_stats, topic_message_count
from tests.integration.harness import REPO_ROOT, free_port
from trionsq.blocking import (
    Config,
    ConnectError,
    ConnectionClosed,
    HandshakeError,
    LookupdError,
    Message,
    NoAvailableNsqd,
    NSQError,
    Producer,
    connect,
    lookup,
    lookup_producers,
    nodes,
    topics,
)

pytestmark = pytest.mark.timeout(60)


def receive(address: str, topic: str, count: int, config: Config | None = None, channel: str = "ch") -> list[bytes]:
    """Subscribe with ``config`` and read ``count`` bodies through ``read_event``, FINning each."""
    with connect(address, config) as conn:
        conn.subscribe(topic, channel)
        conn.ready(count)
        found = []
        deadline = time.monotonic() + 20
        while len(found) < count:
            event = conn.read_event(deadline)
            assert isinstance(event, Message), event
            found.append(event.body)
            event.finish()
        return found


def client_entry(daemon, topic: str, channel: str = "ch") -> dict:
    for entry in nsqd_stats(daemon)["topics"]:
        if entry["topic_name"] == topic:
            for found in entry["channels"]:
                if found["channel_name"] == channel and found["clients"]:
                    return found["clients"][0]
    return {}


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value


# -- one connection ----------------------------------------------------------------------------------


def test_connection_publishes_and_consumes(nsqd, topic):
    with connect(nsqd.tcp_address, Config(client_id="blocking-test")) as conn:
        assert conn.features.version == "1.3.0" and conn.features.max_rdy_count == 2500
        conn.publish(topic, b"one")
        conn.multi_publish(topic, [b"two", b"three"])
        conn.deferred_publish(topic, 0.2, b"four")
        with pytest.raises(NSQError) as caught:
            conn.publish("bad topic", b"x")  # refused before it is written: the connection stays usable
        assert (
            caught.value.code == "E_BAD_TOPIC"
            and str(caught.value) == 'E_BAD_TOPIC PUB topic name "bad topic" is not valid'
        )
        conn.publish(topic, b"five")
    assert sorted(receive(nsqd.tcp_address, topic, 5)) == [b"five", b"four", b"one", b"three", b"two"]


def test_error_frame_is_nsq_error_with_its_code(nsqd_factory, topic):
    daemon = nsqd_factory("--max-msg-size=10")
    with connect(daemon.tcp_address) as conn:
        with pytest.raises(NSQError) as caught:
            conn.publish(topic, b"x" * 11)
        assert (caught.value.code, caught.value.fatal) == ("E_BAD_MESSAGE", True)
        assert str(caught.value) == "E_BAD_MESSAGE PUB message too big 11 > 10"
        with pytest.raises(ConnectionClosed):  # nsqd closed it after the fatal error
            conn.publish(topic, b"ok")


def test_connect_failures_are_connect_errors():
    with pytest.raises(ConnectError, match=r"cannot connect to nsqd 127\.0\.0\.1:\d+: .*refused"):
        connect(f"127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="want host:port"):
        connect("no-port")


def test_heartbeats_are_answered_while_idle(nsqd, topic):
    """nsqd closes a connection that misses two heartbeats: idle for three intervals, it must stay open."""
    with connect(nsqd.tcp_address, Config(heartbeat_interval=1.0)) as conn:
        conn.subscribe(topic, "ch")
        with pytest.raises(TimeoutError):
            conn.read_event(time.monotonic() + 3.0)
        conn.publish(topic, b"still here")
        conn.ready(1)
        event = conn.read_event(time.monotonic() + 5)
        assert isinstance(event, Message) and event.body == b"still here"


def test_raw_read_takes_over_the_stream(nsqd_factory, topic):
    """``read_available`` (the Spark source's loop) gets the decompressed stream: every frame of a backlog, in
    reads that coalesce what the socket holds."""
    daemon = nsqd_factory()
    with connect(daemon.tcp_address) as publisher:
        publisher.multi_publish(topic, [b"%06d" % i for i in range(2000)])
    with connect(daemon.tcp_address, Config(deflate=True)) as conn:
        conn.subscribe(topic, "ch")
        conn.ready(2000)
        stream = conn.take_unparsed()
        deadline = time.monotonic() + 20
        while stream.count(b"\x00\x00\x00\x02") < 2000 or len(stream) < 2000 * (4 + 4 + 26 + 6):
            assert time.monotonic() < deadline, "the backlog did not arrive"
            more = conn.read_available(0.5, coalesce=1 << 20)
            stream += more or b""
        bodies, pos = [], 0
        while pos < len(stream):
            size, frame_type = struct.unpack_from(">ii", stream, pos)
            assert frame_type == 2
            bodies.append(stream[pos + 34 : pos + 4 + size])
            pos += 4 + size
        assert bodies == [b"%06d" % i for i in range(2000)]
        assert conn.read_available(0.05) is None  # nothing more: None, not an error


# -- TLS, compression, AUTH ------------------------------------------------------------------------------


@pytest.fixture
def tls_nsqd(nsqd_factory, certs):
    return nsqd_factory(*certs.daemon_args())


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"snappy": True}, {"snappy": True, "deflate": False, "tls": False}),
        ({"deflate": True, "deflate_level": 3}, {"snappy": False, "deflate": True, "tls": False}),
        ({"tls_v1": True}, {"snappy": False, "deflate": False, "tls": True}),
        ({"tls_v1": True, "snappy": True}, {"snappy": True, "deflate": False, "tls": True}),
        ({"tls_v1": True, "deflate": True}, {"snappy": False, "deflate": True, "tls": True}),
    ],
    ids=["snappy", "deflate", "tls", "tls+snappy", "tls+deflate"],
)
def test_upgrades(tls_nsqd, certs, topic, options, expected):
    config = Config(tls_root_ca_file=str(certs.ca_file), **options)
    bodies = [b"%05d" % i + b"z" * 300 for i in range(500)]  # compressible
    with Producer([tls_nsqd.tcp_address], config) as producer:
        producer.multi_publish(topic, bodies[:250])
        for body in bodies[250:]:
            producer.send(encode_pub(topic, body))
    with connect(tls_nsqd.tcp_address, config) as conn:
        assert (conn.features.snappy, conn.features.deflate, conn.features.tls_v1) == (
            expected["snappy"],
            expected["deflate"],
            expected["tls"],
        )
        conn.subscribe(topic, "ch")
        conn.ready(500)
        found = []
        while len(found) < 500:
            event = conn.read_event(time.monotonic() + 20)
            found.append(event.body)
            event.finish()
        client = client_entry(tls_nsqd, topic)
        assert {key: client[key] for key in ("snappy", "deflate", "tls")} == expected
    assert found == bodies


def test_tls_verifies_the_certificate(tls_nsqd, certs):
    with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        connect(tls_nsqd.tcp_address, Config(tls_v1=True))  # the system CAs do not know the test CA
    with connect(tls_nsqd.tcp_address, Config(tls_v1=True, tls_insecure_skip_verify=True)) as conn:
        assert conn.features.tls_v1


def test_tls_asked_of_nsqd_without_tls_is_refused(nsqd):
    with pytest.raises(HandshakeError, match="does not offer TLS"):
        connect(nsqd.tcp_address, Config(tls_v1=True))
    with (
        pytest.raises(NoAvailableNsqd, match="does not offer TLS"),
        Producer([nsqd.tcp_address], Config(tls_v1=True)) as producer,
    ):
        producer.publish("refused", b"never in the clear")


def test_local_addr_binds_the_source_address(nsqd, topic):
    # go-nsq's local_addr, as the trio driver applies it: 127.0.0.2 is loopback too on Linux
    config = Config()
    config.set("local_addr", "127.0.0.2:0")
    with connect(nsqd.tcp_address, config) as conn:
        conn.subscribe(topic, "ch")
        assert conn.sock.getsockname()[0] == "127.0.0.2"
        client = wait_until(lambda: client_entry(nsqd, topic), 10, "the client in nsqd's /stats")
    assert client["remote_address"].startswith("127.0.0.2:")


@pytest.fixture
def auth_nsqd(nsqd_factory, auth_server):
    return nsqd_factory(f"--auth-http-address={auth_server.address}")


def test_auth(auth_nsqd, topic):
    with connect(auth_nsqd.tcp_address, Config(auth_secret="everything")) as conn:
        assert conn.features.auth_required and conn.auth.identity == "alice"
        conn.publish(topic, b"authorized")
    with pytest.raises(HandshakeError, match="requires AUTH and no auth_secret is set"):
        connect(auth_nsqd.tcp_address)
    with pytest.raises(NSQError) as caught:
        connect(auth_nsqd.tcp_address, Config(auth_secret="wrong"))
    assert caught.value.code == "E_AUTH_FAILED"


# -- the producer ---------------------------------------------------------------------------------------


def test_producer_pipelines_and_counts(nsqd, topic):
    with Producer(nsqd.tcp_address, max_in_flight=8) as producer:
        batch = encode_mpub(topic, [b"m"] * 100)
        for _ in range(200):
            producer.send(batch, 100)
        producer.publish(topic, b"p")
        producer.deferred_publish(topic, 0.1, b"d")
        producer.flush()
        stats = producer.stats()
    assert (stats.messages, stats.commands, stats.connects, stats.retried_commands) == (20_002, 202, 1, 0)
    assert stats.per_nsqd == {nsqd.tcp_address: 20_002}
    assert topic_message_count(nsqd, topic) == 20_002


def test_producer_raises_request_errors_and_goes_on(nsqd_factory, topic):
    daemon = nsqd_factory("--max-msg-size=10")
    with Producer([daemon.tcp_address]) as producer:
        with pytest.raises(NSQError) as caught:
            producer.publish(topic, b"x" * 11)
        assert caught.value.code == "E_BAD_MESSAGE"
        # the refused command's connection is gone (nsqd closed it); the next publish reconnects
        producer.publish(topic, b"ok")
        assert producer.stats().connects == 2
    assert topic_message_count(daemon, topic) == 1


def test_producer_requests_behind_a_refused_one_are_sent_again(nsqd_factory, topic):
    """nsqd runs nothing after a fatal error: the commands pipelined behind it are written again by the next flush."""
    daemon = nsqd_factory("--max-msg-size=10")
    producer = Producer([daemon.tcp_address], max_in_flight=16)
    try:
        producer.send(encode_pub(topic, b"a"))
        producer.send(encode_pub(topic, b"x" * 11))
        for body in (b"b", b"c", b"d"):
            producer.send(encode_pub(topic, body))
        with pytest.raises(NSQError):
            producer.flush()
        producer.flush()
    finally:
        producer.close()
    assert sorted(receive(daemon.tcp_address, topic, 4)) == [b"a", b"b", b"c", b"d"]


def test_producer_fails_over_to_the_next_address(nsqd_factory, topic):
    first, second = nsqd_factory(), nsqd_factory()
    dead = f"127.0.0.1:{free_port()}"
    with Producer([dead, first.tcp_address, second.tcp_address], Config(dial_timeout=2.0)) as producer:
        producer.publish(topic, b"a")
        assert producer.stats().per_nsqd == {first.tcp_address: 1}
        first.stop()
        for i in range(20):
            producer.publish(topic, b"after %d" % i)
        stats = producer.stats()
    assert stats.per_nsqd[second.tcp_address] == 20
    assert topic_message_count(second, topic) == 20


def test_idle_producer_keeps_its_connection(nsqd, topic):
    """Nothing answers heartbeats between a blocking producer's calls: its connection asks for none, so nsqd (which
    drops a connection that misses two) keeps it through an idle spell of three intervals."""
    with Producer(nsqd.tcp_address, Config(heartbeat_interval=1.0)) as producer:
        producer.publish(topic, b"before")
        time.sleep(3.0)
        producer.publish(topic, b"after")
        assert producer.stats().connects == 1
    assert topic_message_count(nsqd, topic) == 2


def test_producer_reconnects_to_a_restarted_nsqd(nsqd_factory, topic):
    """nsqd restarted while the producer was idle: found before the next write, that is a new connection to the same
    address, not a failure (with one address, a failure would be NoAvailableNsqd)."""
    port = free_port()
    first = nsqd_factory(f"--tcp-address=127.0.0.1:{port}")
    with Producer(first.tcp_address) as producer:
        producer.publish(topic, b"one")
        first.stop()
        second = nsqd_factory(f"--tcp-address=127.0.0.1:{port}")
        producer.publish(topic, b"two")
        stats = producer.stats()
    assert (stats.connects, stats.retried_commands, stats.messages) == (2, 0, 2)
    assert topic_message_count(second, topic) == 1


def test_producer_with_no_nsqd_left_raises_no_available_nsqd(nsqd, topic):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with Producer(dead) as producer, pytest.raises(NoAvailableNsqd) as caught:
        producer.publish(topic, b"x")
    assert list(caught.value.errors) == dead
    assert all(isinstance(error, ConnectError) for error in caught.value.errors.values())


def test_request_into_reads_a_large_answer_into_one_buffer(nsqd_factory, topic):
    """``request_into`` (the Spark source's LREAD): the answer's frame straight into a buffer of its size, the
    same bytes as ``request``'s; a heartbeat waiting before it is answered; an error frame is raised and closes
    the connection; on a compressed stream it is ``request``; the core reads on after it."""
    from protocol.log import encode_log, encode_lread

    daemon = nsqd_factory()
    with connect(daemon.tcp_address) as publisher:
        publisher.request(encode_log(topic, "ch"))
        for start in range(0, 3000, 500):
            publisher.multi_publish(topic, [b"%06d" % i * 100 for i in range(start, start + 500)])
    whole = encode_lread(topic, "ch", 0, 3000, 4 << 20)
    with connect(daemon.tcp_address, Config(heartbeat_interval=1.0)) as conn:
        expected = conn.request(whole)
        assert len(expected) > 1_500_000
        time.sleep(1.5)  # a heartbeat is waiting in the socket before the answer
        got = conn.request_into(whole)
        assert isinstance(got, bytearray) and got == expected
        assert conn.request(encode_lread(topic, "ch", 2999, 3000)) == conn.request_into(
            encode_lread(topic, "ch", 2999, 3000)
        )
        with pytest.raises(NSQError) as caught:
            conn.request_into(encode_lread(topic, "ch", 5000, 6000))
        assert caught.value.code == "E_LOG_PAST_END" and conn.closed
    with connect(daemon.tcp_address, Config(deflate=True)) as conn:
        assert conn.request_into(whole) == expected


class ScriptedNsqd:
    """A listener that answers IDENTIFY as nsqd does, then answers each command with the next of ``replies``
    (an error frame's text, or None to stay silent), and records the commands it got."""

    def __init__(self, replies: list[bytes | None]) -> None:
        self.replies = list(replies)
        self.commands: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, self.listener:
            conn.settimeout(20)
            data = conn.recv(65536)
            while len(data) < 4 + 9 + 4 or len(data) < 17 + struct.unpack_from(">i", data, 13)[0]:
                data += conn.recv(65536)
            data = data[17 + struct.unpack_from(">i", data, 13)[0] :]
            conn.sendall(encode_frame(FRAME_TYPE_RESPONSE, json.dumps({"max_rdy_count": 2500}).encode()))
            for reply in self.replies:
                while b"\n" not in data or len(data) < data.index(b"\n") + 5:
                    data += conn.recv(65536)
                line_end = data.index(b"\n")
                size = struct.unpack_from(">i", data, line_end + 1)[0]
                while len(data) < line_end + 5 + size:
                    data += conn.recv(65536)
                self.commands.append(data[:line_end])
                data = data[line_end + 5 + size :]
                if reply is None:
                    self.done.wait(20)
                    return
                conn.sendall(encode_frame(FRAME_TYPE_ERROR, reply))
                return  # nsqd closes the connection after a fatal error


def test_producer_moves_on_after_a_server_side_failure(nsqd, topic):
    failing = ScriptedNsqd([b"E_PUB_FAILED PUB failed exiting"])
    with Producer([failing.address, nsqd.tcp_address]) as producer:
        producer.publish(topic, b"moved")
        stats = producer.stats()
    assert failing.commands == [f"PUB {topic}".encode()]
    assert stats.per_nsqd == {nsqd.tcp_address: 1} and stats.retried_commands == 1 and stats.resent_messages == 0
    assert receive(nsqd.tcp_address, topic, 1) == [b"moved"]


def test_producer_resends_after_a_reply_timeout(nsqd, topic):
    silent = ScriptedNsqd([None])
    try:
        with Producer([silent.address, nsqd.tcp_address], response_timeout=0.5) as producer:
            started = time.monotonic()
            producer.publish(topic, b"maybe twice")
            assert time.monotonic() - started < 5
            stats = producer.stats()
    finally:
        silent.done.set()
    assert stats.resent_messages == 1 and stats.per_nsqd == {nsqd.tcp_address: 1}


# -- lookupd --------------------------------------------------------------------------------------------


def test_lookupd_helpers(tmp_path, topic):
    from tests.integration.harness import NsqdProcess, stop_all
    from tests.integration.lookupd_harness import LookupdProcess, wait_for_producers

    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    daemon = None
    try:
        address = "{}:{}".format(*lookupd.http_address)
        assert lookup(address, topic) == []  # unknown topic: no error
        daemon = NsqdProcess(
            tmp_path / "nsqd", ["--lookupd-tcp-address={}:{}".format(*lookupd.tcp), "--broadcast-address=127.0.0.1"]
        ).start()
        with Producer(daemon.tcp_address) as producer:
            producer.publish(topic, b"x")
        wait_for_producers(lookupd, topic, {daemon.tcp[1]})
        assert lookup(address, topic) == [daemon.tcp_address]
        assert lookup(f"http://{address}", topic) == [daemon.tcp_address]
        (peer,) = lookup_producers(address, topic)
        assert (peer.tcp_port, peer.version) == (daemon.tcp[1], "1.3.0")
        (node,) = nodes(address)
        assert node.tcp_address == daemon.tcp_address and topic in node.topics
        assert topic in topics(address)
    finally:
        stop_all([d for d in (daemon, lookupd) if d is not None])
    with pytest.raises(LookupdError, match=rf"GET http://127\.0\.0\.1:\d+/lookup\?topic={topic}: .*refused"):
        lookup(address, topic, timeout=2)


# -- no trio ---------------------------------------------------------------------------------------------


def test_blocking_driver_and_spark_connector_import_no_trio():
    """Spark's Python workers must not need trio: the blocking driver, and the connector's consumer and publisher
    built on it, load without it."""
    code = (
        "import sys, trionsq.blocking, spark_connector.consumer, spark_connector.publisher; "
        "print(sorted(m for m in sys.modules if m == 'trio' or m.startswith('trio.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
