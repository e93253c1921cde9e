"""The driver side without Spark's JVM: the stream reader's driver methods against real nsqd
subprocesses, checked through nsqd's own /stats (what was FIN'd, what is in flight, RDY)."""

from __future__ import annotations

import importlib.util
import json
import socket
import struct
import threading
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    encode_frame,
)
from spark_connector.connection import NsqConnectionError
from spark_connector.options import DEFAULT_MAX_BYTES_PER_TRIGGER, SourceOptions
from spark_connector.stream_reader import NsqStreamReader, make_offset, parse_offset
from tests.integration.harness import free_port, http_get
from tests.spark.conftest import bodies, publish, wait_until

pytestmark = pytest.mark.timeout(120)


def make_reader(tmp_path, **options) -> NsqStreamReader:
    # the driver path's consumer and write-ahead log: with auto, this project's nsqd would take the log path
    raw = {"channel": "spark", "walPath": str(tmp_path / "wal"), "readMode": "driver", **options}
    return NsqStreamReader(SourceOptions.parse({k: str(v) for k, v in raw.items()}))


def channel_stats(nsqd, topic: str, channel: str = "spark") -> dict:
    status, body = http_get(nsqd.http(), f"/stats?format=json&topic={topic}")
    assert status == 200, body
    for t in json.loads(body)["topics"] or []:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return {}


def wait_for_total(reader: NsqStreamReader, start: dict, total: int, timeout: float = 30) -> dict:
    def reached():
        end = reader.latestOffset(start, ReadAllAvailable())
        return end if sum(parse_offset(end).values()) >= total else None

    return wait_until(reached, timeout, f"{total} messages in the write-ahead log")


def partition_bodies(parts) -> list[bytes]:
    out = []
    for p in parts:
        pos = 0
        sizes = memoryview(p.body_sizes).cast("I")
        for size in sizes:
            out.append(p.bodies[pos : pos + size])
            pos += size
    return out


def test_nothing_starts_before_the_first_driver_call(tmp_path, nsqd, topic):
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic})
    assert not (tmp_path / "wal").exists()
    assert channel_stats(nsqd, topic) == {}
    reader.stop()


def test_durable_mode_fins_once_logged(tmp_path, nsqd, topic):
    expected = bodies("d", 0, 300)
    publish(nsqd, topic, expected)
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic})
    try:
        start = reader.initialOffset()
        assert start == {"version": 1, "positions": {}}
        end = wait_for_total(reader, start, 300)
        assert end == {"version": 1, "positions": {nsqd.tcp_address: 300}}
        parts = reader.partitions(start, end)
        assert [(p.nsqd, p.start, p.end) for p in parts] == [(nsqd.tcp_address, 0, 300)]
        assert partition_bodies(parts) == expected
        # Everything logged was FIN'd: nothing in flight, nothing queued.
        wait_until(
            lambda: (s := channel_stats(nsqd, topic)) and s["in_flight_count"] == 0 and s["depth"] == 0,
            10,
            "nsqd to see every FIN",
        )
        limited = reader.latestOffset(start, ReadMaxRows(120))
        assert limited == {"version": 1, "positions": {nsqd.tcp_address: 120}}
    finally:
        reader.stop()


def test_commit_mode_touches_then_fins_at_commit_and_drops_redeliveries(tmp_path, nsqd, topic):
    expected = bodies("c", 0, 200)
    publish(nsqd, topic, expected)
    options = {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "ackMode": "commit", "msgTimeoutMs": 1000}
    reader = make_reader(tmp_path, **options)
    try:
        start = reader.initialOffset()
        end = wait_for_total(reader, start, 200)
        assert channel_stats(nsqd, topic)["in_flight_count"] == 200
        # Three timeouts' worth of time: TOUCH keeps every message alive.
        time.sleep(3.0)
        stats = channel_stats(nsqd, topic)
        assert (stats["in_flight_count"], stats["timeout_count"]) == (200, 0)
    finally:
        reader.stop()  # no commit: the messages stay unacknowledged in nsqd

    # A new driver on the same log: nsqd redelivers all 200, the log recognises every copy.
    reader = make_reader(tmp_path, **options)
    try:
        start2 = reader.initialOffset()
        assert start2 == {"version": 1, "positions": {}}  # nothing was committed
        group = reader._group
        consumer = group.consumers[nsqd.tcp_address]
        wait_until(lambda: consumer.stats.duplicates >= 200, 30, "the redelivered copies")
        assert reader.latestOffset(start2, ReadAllAvailable()) == end
        assert consumer.stats.logged == 0
        reader.commit(end)
        wait_until(
            lambda: (s := channel_stats(nsqd, topic)) and s["in_flight_count"] == 0 and s["depth"] == 0,
            10,
            "the FINs sent at commit",
        )
        assert partition_bodies(reader.partitions(start2, end)) == expected
    finally:
        reader.stop()


def test_backlog_bound_pauses_delivery_until_commit(tmp_path, nsqd, topic):
    publish(nsqd, topic, bodies("b", 0, 400))
    reader = make_reader(
        tmp_path,
        **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "maxBacklogMessages": 100, "maxInFlight": 10},
    )
    try:
        start = reader.initialOffset()
        wait_for_total(reader, start, 100)

        def paused():
            clients = channel_stats(nsqd, topic).get("clients") or []
            return clients and clients[0]["ready_count"] == 0

        wait_until(paused, 10, "RDY 0 once the backlog reached its bound")
        logged = sum(parse_offset(reader.latestOffset(start, ReadAllAvailable())).values())
        assert 100 <= logged <= 110  # at most one RDY window past the bound
        offset = start
        while sum(parse_offset(offset).values()) < 400:  # each commit lets delivery resume
            offset = wait_for_total(reader, start, sum(parse_offset(offset).values()) + 1)
            reader.commit(offset)
        assert channel_stats(nsqd, topic)["depth"] == 0
    finally:
        reader.stop()


def test_batches_carry_at_most_max_bytes_through_the_driver(tmp_path, nsqd, topic):
    expected = [b"%06d" % i + b"x" * 994 for i in range(400)]
    publish(nsqd, topic, expected)
    options = {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "maxBytesPerTrigger": 100_000}
    reader = make_reader(tmp_path, **options)
    try:
        start = reader.initialOffset()
        wait_until(lambda: reader.reportLatestOffset() == make_offset({nsqd.tcp_address: 400}), 30, "400 logged")
        read, sizes = [], []
        while len(read) < 400:
            end = reader.latestOffset(start, ReadAllAvailable())
            parts = reader.partitions(start, end)
            batch = partition_bodies(parts)
            sizes.append(sum(len(p.bodies) + len(p.ids) for p in parts))
            assert batch, f"no progress at {start}"
            read += batch
            reader.commit(end)
            start = end
        assert read == expected
        assert max(sizes) <= 100_000 and len(sizes) >= 4
    finally:
        reader.stop()


def test_default_byte_bound_gives_way_to_max_offsets_per_trigger():
    raw = {"nsqd.tcp.addresses": "127.0.0.1:4150", "topic": "t", "channel": "c", "walPath": "w"}
    assert SourceOptions.parse(raw).batch_byte_cap == DEFAULT_MAX_BYTES_PER_TRIGGER
    assert SourceOptions.parse({**raw, "maxOffsetsPerTrigger": "500"}).batch_byte_cap is None
    assert (
        SourceOptions.parse({**raw, "maxMessagesPerTrigger": "500", "maxBytesPerTrigger": "4096"}).batch_byte_cap
        == 4096
    )


def test_commit_deletes_covered_segments(tmp_path, nsqd, topic):
    publish(nsqd, topic, bodies("s", 0, 600))
    reader = make_reader(
        tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "walSegmentBytes": 2000, "maxInFlight": 20}
    )
    try:
        start = reader.initialOffset()
        end = wait_for_total(reader, start, 600)
        mlog = reader._group.wal.logs[nsqd.tcp_address]
        before = mlog.segment_count()
        assert before > 3
        reader.commit(end)
        assert mlog.segment_count() == 1
        assert json.loads((tmp_path / "wal" / "committed.json").read_text()) == end
    finally:
        reader.stop()
    again = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic})
    try:
        assert again.initialOffset() == end  # a fresh checkpoint resumes after the last commit
    finally:
        again.stop()


def test_unreachable_nsqd_is_a_clear_error(tmp_path, topic):
    address = f"127.0.0.1:{free_port()}"
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": address, "topic": topic, "connectTimeoutMs": 500})
    with pytest.raises(NsqConnectionError, match=f"cannot consume from nsqd {address}.*refused"):
        reader.initialOffset()
    reader.stop()


def test_unreachable_lookupd_is_a_clear_error(tmp_path, topic):
    address = f"127.0.0.1:{free_port()}"
    reader = make_reader(tmp_path, **{"lookupd.http.addresses": address, "topic": topic})
    with pytest.raises(NsqConnectionError, match=f"cannot reach any lookupd: {address}"):
        reader.initialOffset()
    reader.stop()


def test_checkpoint_ahead_of_the_log_is_a_clear_error(tmp_path, nsqd, topic):
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic})
    try:
        with pytest.raises(Exception, match="walPath .* holds no write-ahead log: with ackMode=durable"):
            reader.latestOffset({"version": 1, "positions": {nsqd.tcp_address: 50}}, ReadAllAvailable())
    finally:
        reader.stop()


@pytest.mark.skipif(
    importlib.util.find_spec("lookupd") is None,
    reason="nsqlookupd (python -m lookupd) is not importable in this checkout yet",
)
def test_lookupd_discovery_gives_one_partition_per_nsqd(tmp_path, nsqd_factory, topic):
    from tests.spark.lookupd_helpers import LookupdProcess, register_producer

    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    registrations = []
    reader = make_reader(
        tmp_path, **{"lookupd.http.addresses": lookupd.http_address, "topic": topic, "lookupd.pollIntervalMs": 100}
    )
    try:
        start = reader.initialOffset()  # lookupd does not know the topic yet: no error, no partition
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        daemons = [nsqd_factory(), nsqd_factory()]
        for n, daemon in enumerate(daemons):
            publish(daemon, topic, bodies(f"l{n}", 0, 50))
            registrations.append(register_producer(lookupd, daemon, topic))
        end = wait_for_total(reader, start, 100)
        parts = reader.partitions(start, end)
        assert sorted(p.nsqd for p in parts) == sorted(d.tcp_address for d in daemons)
        assert sorted(partition_bodies(parts)) == sorted(bodies("l0", 0, 50) + bodies("l1", 0, 50))
    finally:
        reader.stop()
        for sock in registrations:
            sock.close()
        lookupd.stop()


@pytest.mark.parametrize(
    ("options", "flags"),
    [
        ({"snappy": "true"}, {"snappy": True}),
        ({"deflate": "true", "deflate.level": "3"}, {"deflate": True}),
        ({"tls": "true", "snappy": "true"}, {"tls": True, "snappy": True}),
    ],
    ids=["snappy", "deflate", "tls+snappy"],
)
def test_connection_upgrades(tmp_path, nsqd_factory, topic, options, flags):
    from tests.integration.features import make_certificates

    certs = make_certificates(tmp_path / "certs")
    nsqd = nsqd_factory(*certs.daemon_args())
    expected = bodies("u", 0, 300)
    publish(nsqd, topic, expected)
    if options.get("tls"):
        options = {**options, "tls.caFile": str(certs.ca_file)}
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, **options})
    try:
        start = reader.initialOffset()
        end = wait_for_total(reader, start, 300)
        assert partition_bodies(reader.partitions(start, end)) == expected
        client = channel_stats(nsqd, topic)["clients"][0]
        assert {key: client[key] for key in flags} == flags
    finally:
        reader.stop()


AUTHORIZED = {
    "ttl": 3600,
    "identity": "spark-reader",
    "identity_url": "",
    "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}],
}


@pytest.fixture
def auth_nsqd(nsqd_factory):
    from tests.integration.features import ScriptedAuthServer

    server = ScriptedAuthServer()
    server.answers["s3cret"] = (200, AUTHORIZED)
    try:
        yield nsqd_factory(f"--auth-http-address={server.address}")
    finally:
        server.close()


def test_auth_secret_is_sent_when_nsqd_requires_it(tmp_path, auth_nsqd, topic):
    from protocol.commands import encode_auth
    from tests.integration.harness import RawClient

    expected = bodies("a", 0, 100)
    with RawClient(auth_nsqd.tcp) as client:
        client.send(encode_auth(b"s3cret"))
        client.read_response()
        client.publish_many(topic, expected)
    reader = make_reader(
        tmp_path, **{"nsqd.tcp.addresses": auth_nsqd.tcp_address, "topic": topic, "auth.secret": "s3cret"}
    )
    try:
        start = reader.initialOffset()
        end = wait_for_total(reader, start, 100)
        assert partition_bodies(reader.partitions(start, end)) == expected
        assert channel_stats(auth_nsqd, topic)["clients"][0]["auth_identity"] == "spark-reader"
    finally:
        reader.stop()


@pytest.mark.parametrize(("secret", "error"), [(None, "set the auth.secret option"), ("wrong", "E_AUTH_FAILED")])
def test_auth_refusal_fails_at_once(tmp_path, auth_nsqd, topic, secret, error):
    options = {"nsqd.tcp.addresses": auth_nsqd.tcp_address, "topic": topic, "connectTimeoutMs": 60000}
    if secret:
        options["auth.secret"] = secret
    reader = make_reader(tmp_path, **options)
    # A refusal is final: reported as soon as nsqd answers, not after connectTimeoutMs.
    with pytest.raises(NsqConnectionError, match=f"nsqd {auth_nsqd.tcp_address} refused the consumer: .*{error}"):
        reader.initialOffset()
    reader.stop()


def _scripted_nsqd(parts: list[tuple[bytes, bytes]], chunk: int, received: list[bytes], done: threading.Event):
    """A listener that answers the consumer's handshake as nsqd does, then sends each part's
    frames ``chunk`` bytes per write once the consumer has sent the part's awaited line, and
    keeps what the consumer sends until it has FIN'd four messages."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            conn.settimeout(30)
            data = b""

            def read_until(marker: bytes) -> None:
                nonlocal data
                while marker not in data:
                    data += conn.recv(65536)

            read_until(b"IDENTIFY\n")
            while len(data) < data.index(b"IDENTIFY\n") + 13:
                data += conn.recv(65536)
            size = struct.unpack(">i", data[data.index(b"IDENTIFY\n") + 9 :][:4])[0]
            while len(data) < data.index(b"IDENTIFY\n") + 13 + size:
                data += conn.recv(65536)
            conn.sendall(encode_frame(FRAME_TYPE_RESPONSE, b'{"max_rdy_count": 2500, "msg_timeout": 60000}'))
            read_until(b"SUB ")
            read_until(b"\n")
            conn.sendall(encode_frame(FRAME_TYPE_RESPONSE, b"OK"))
            for awaited, frames in parts:
                read_until(awaited)
                for i in range(0, len(frames), chunk):
                    conn.sendall(frames[i : i + chunk])
            while data.count(b"FIN ") < 4 and not done.is_set():
                more = conn.recv(65536)
                if not more:
                    break
                data += more
            received.append(data)
            done.wait(30)

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("chunk", [1, 7, 33, 1 << 20])
def test_frames_split_anywhere_are_parsed(tmp_path, topic, chunk):
    """Messages, a heartbeat and a non-fatal error, cut into writes of any size: every message is
    logged once with its fields, the heartbeat is answered, the copy of a message is dropped,
    and every message is FIN'd."""
    messages = [
        (1_700_000_000_000_000_001, 1, b"0000000000000001", b"first"),
        (1_700_000_000_000_000_002, 3, b"0000000000000002", b"x" * 70_000),
        (1_700_000_000_000_000_003, 1, b"0000000000000003", b""),
    ]
    frames = [
        encode_frame(FRAME_TYPE_MESSAGE, struct.pack(">qH16s", ts, att, mid) + body) for ts, att, mid, body in messages
    ]
    # The copy of the first message comes once the first is FIN'd (logged), as nsqd's would.
    script = [
        (
            b"RDY ",
            b"".join(
                [
                    frames[0],
                    HEARTBEAT_FRAME,
                    frames[1],
                    encode_frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0000000000000009 failed"),
                ]
            ),
        ),
        (b"FIN 0000000000000002\n", frames[0] + frames[2]),
    ]
    received: list[bytes] = []
    done = threading.Event()
    address = _scripted_nsqd(script, chunk, received, done)
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": address, "topic": topic})
    try:
        start = reader.initialOffset()
        end = wait_for_total(reader, start, 3)
        assert end == {"version": 1, "positions": {address: 3}}
        consumer = reader._group.consumers[address]
        wait_until(lambda: received, 30, "the consumer's FINs")
        parts = reader.partitions(start, end)
        assert partition_bodies(parts) == [body for *_, body in messages]
        assert parts[0].ids == b"".join(mid for _, _, mid, _ in messages)
        assert list(memoryview(parts[0].timestamps).cast("q")) == [ts for ts, *_ in messages]
        assert list(memoryview(parts[0].attempts).cast("H")) == [att for _, att, _, _ in messages]
        assert consumer.stats.duplicates == 1
        sent = received[0]
        assert b"NOP\n" in sent
        assert sorted(line for line in sent.split(b"\n") if line.startswith(b"FIN ")) == sorted(
            [b"FIN " + mid for _, _, mid, _ in messages] + [b"FIN 0000000000000001"]
        )
    finally:
        done.set()
        reader.stop()
