"""Data directories move between nsqd 1.3.0 and trionsq in both directions.

The "written by nsqd" directory is built here byte by byte from the file formats (nsqd.dat JSON, diskqueue meta
and segment files, records in the 26-byte message encoding); the directory trionsq writes is checked with readers
written from the same formats, so a real nsqd can take it over."""

from __future__ import annotations

import json
import re
import stat
import time

import pytest

from tests.integration.harness import RawClient, dpub
from tests.integration.http_helpers import stats, wait_for
from tests.integration.persistence_helpers import (
    NSQ_FILE,
    SIDE_FILE,
    DataDir,
    channel_stats,
    consume_exactly,
    create_channel,
    framed,
    http,
    make_record,
    metadata,
    parse_record,
    read_queue,
    receive,
)

T0 = 1_700_000_000_000_000_000


def message_id(n: int) -> bytes:
    return b"%016x" % (0x18A398C44E669000 + n)


@pytest.mark.timeout(60)
def test_trionsq_reads_a_data_directory_written_by_nsqd(tmp_path):
    path = tmp_path / "from-nsqd"
    path.mkdir()
    (path / "nsqd.dat").write_bytes(
        b'{"topics":[{"name":"events","paused":false,"channels":[{"name":"archive","paused":false},'
        b'{"name":"audit","paused":true}]},{"name":"idle","paused":true,"channels":null}],"version":"1.3.0"}'
    )
    # the topic's own backlog (written at nsqd's shutdown): goes to every channel once trionsq starts
    topic_records = [make_record(T0 + n, 0, message_id(n), b"topic-%d" % n) for n in range(3)]
    topic_file = framed(topic_records)
    (path / "events.diskqueue.000000.dat").write_bytes(topic_file)
    (path / "events.diskqueue.meta.dat").write_bytes(b"3\n0,0\n0,%d\n" % len(topic_file))
    # a channel queue after an empty (numbering went on to 3), two segment files, one record already read
    channel_records = [make_record(T0 + n, n % 3, message_id(n), b"channel-%d" % n * (n + 1)) for n in range(10, 15)]
    file3, file4 = framed(channel_records[:3]), framed(channel_records[3:])
    (path / "events:archive.diskqueue.000003.dat").write_bytes(file3)
    (path / "events:archive.diskqueue.000004.dat").write_bytes(file4)
    first = 4 + len(channel_records[0])
    (path / "events:archive.diskqueue.meta.dat").write_bytes(b"4\n3,%d\n4,%d\n" % (first, len(file4)))
    for queue in ("events:audit", "idle"):
        (path / f"{queue}.diskqueue.meta.dat").write_bytes(b"0\n0,0\n0,0\n")

    d = DataDir(path)
    try:
        daemon = d.start()
        got = consume_exactly(daemon, "events", "archive", 7)
        by_id = {m.id: m for m in got}
        for record in channel_records[1:] + topic_records:
            timestamp, attempts, msg_id, body = parse_record(record)
            m = by_id[msg_id]
            assert (m.timestamp, m.attempts, m.body) == (timestamp, attempts + 1, body)
        node = stats(http(daemon))
        topics = {t["topic_name"]: t for t in node["topics"]}
        assert set(topics) == {"events", "idle"}
        assert topics["idle"]["paused"] and topics["idle"]["channels"] == []
        audit = {c["channel_name"]: c for c in topics["events"]["channels"]}["audit"]
        assert audit["paused"] and audit["depth"] == 3
        d.stop()
    finally:
        d.cleanup()


@pytest.mark.timeout(60)
def test_nsqd_can_read_a_data_directory_written_by_trionsq(tmp_path):
    path = tmp_path / "from-trionsq"
    path.mkdir()
    d = DataDir(path, ["--max-bytes-per-file=1024", "--mem-queue-size=5"])
    try:
        daemon = d.start()
        create_channel(daemon, "orders", "ship")
        bodies = [b"order-%03d" % n for n in range(60)]
        started = time.time_ns()
        with RawClient(daemon.tcp) as client:
            client.publish_many("orders", bodies)
            client.send(dpub("orders", 600_000, b"later"))
            client.expect_ok()
        with RawClient(daemon.tcp) as consumer:
            consumer.subscribe("orders", "ship", ready=3)
            *done, in_flight = receive(consumer, 3, finish=False)
            # two finished, one still in flight at the stop; RDY 0 in the same write so nothing else goes out
            consumer.send(b"".join(b"FIN %s\n" % m.id for m in done) + b"RDY 0\n")
            wait_for(lambda: channel_stats(daemon, "orders", "ship")["in_flight_count"] == 1)
            d.stop()
    finally:
        d.cleanup()
    ended = time.time_ns()

    files = d.files()
    assert all(NSQ_FILE.match(f) or SIDE_FILE.match(f) for f in files), files
    sides = [f for f in files if SIDE_FILE.match(f)]
    assert "orders:ship.deferred.dat" in sides
    assert all(f[: -len(".crc")] in files for f in sides if f.endswith(".crc"))  # one per segment
    assert len([f for f in files if re.match(r"orders:ship\.diskqueue\.\d{6}\.dat$", f)]) > 1  # it rolled
    for f in files:
        assert stat.S_IMODE((path / f).stat().st_mode) == 0o600, f
    assert (path / "nsqd.dat").read_bytes() == (
        b'{"topics":[{"name":"orders","paused":false,"channels":[{"name":"ship","paused":false}]}],"version":"1.3.0"}'
    )
    assert metadata(path)["version"] == "1.3.0"
    assert read_queue(path, "orders") == []
    records = [parse_record(r) for r in read_queue(path, "orders:ship")]
    for timestamp, _attempts, msg_id, _body in records:
        assert started <= timestamp <= ended
        assert re.fullmatch(rb"[0-9a-f]{16}", msg_id)
    expected = {b: 0 for b in bodies if b not in {m.body for m in done}}
    expected[in_flight.body] = 1  # attempts kept
    expected[b"later"] = 0
    assert {body: attempts for _, attempts, _, body in records} == expected
    assert len(records) == len(expected)  # each message once
    assert len({msg_id for _, _, msg_id, _ in records}) == len(records)
    meta = (path / "orders:ship.diskqueue.meta.dat").read_text("ascii")
    assert re.fullmatch(r"\d+\n\d+,\d+\n\d+,\d+\n", meta)
    json.loads((path / "nsqd.dat").read_bytes())  # and plain JSON
