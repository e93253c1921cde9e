"""Storage faults on a real nsqd: damaged queue files (cut short, a size field overwritten, a body byte flipped, a
segment deleted) and a failing fsync.

Without a replica a damaged record costs that record alone (or the records a cut or a deletion took): every
other message is delivered, no damaged body ever is, and ``/stats`` counts what was lost (``damaged_count``). A
failed fsync before an acknowledgement turns it into ``E_PUB_FAILED``/``E_MPUB_FAILED`` (HTTP 503), never an OK.
The fsync failure is injected by the test-only hook of ``nsqd/queues/diskqueue.py`` (``NSQD_TEST_FAIL_FSYNC``)."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from tests.integration.harness import RawClient, rdy, sub
from tests.integration.http_helpers import post, wait_for
from tests.integration.persistence_helpers import DataDir, channel_stats, create_channel, http, receive

TOPIC, CHANNEL = "orders", "ship"
COUNT = 2000
#: 2,000 records of 26 + 64 bytes (94 framed) in segments of 32 KiB: 6 files of 348 records, the last one shorter
SEGMENT = 32 * 1024
PER_FILE = SEGMENT // 94


def body(n: int) -> bytes:
    head = b"%06d:" % n
    return head + hashlib.sha256(head).hexdigest()[: 64 - len(head)].encode()


def intact(data: bytes) -> bool:
    return data == body(int(data[:6]))


def segment(path: Path, num: int) -> Path:
    return path / f"{TOPIC}:{CHANNEL}.diskqueue.{num:06d}.dat"


def record_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    offsets, pos = [], 0
    while pos + 4 <= len(data):
        offsets.append(pos)
        pos += 4 + struct.unpack_from(">i", data, pos)[0]
    return offsets


def cut(path: Path) -> int:
    """Cut the file to 40% of its length; returns the records lost (the one cut through included)."""
    offsets = record_offsets(path)
    size = int(path.stat().st_size * 0.4)
    return sum(1 for at in offsets if at + 94 > size)


def damage_size_field(path: Path) -> int:
    at = record_offsets(path)[100]
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack(">i", 0x00FFFFFF))
    return 1


def flip_body_byte(path: Path) -> int:
    at = record_offsets(path)[200]
    with open(path, "r+b") as f:
        f.seek(at + 4 + 26 + 20)
        byte = f.read(1)
        f.seek(at + 4 + 26 + 20)
        f.write(bytes([byte[0] ^ 0x01]))
    return 1


def delete(path: Path) -> int:
    lost = len(record_offsets(path))
    os.remove(path)
    return lost


def cut_to_40(path: Path) -> int:
    lost = cut(path)
    os.truncate(path, int(path.stat().st_size * 0.4))
    return lost


DAMAGE = {
    "cut to 40%": cut_to_40,
    "size field": damage_size_field,
    "body byte": flip_body_byte,
    "segment deleted": delete,
}


def drain(daemon, expected: int) -> list[bytes]:
    """Every message the channel delivers (FIN each), until ``expected`` came and the channel is empty."""
    with RawClient(daemon.tcp) as client:
        client.send(sub(TOPIC, CHANNEL))
        client.expect_ok()
        client.send(rdy(500))
        got = [m.body for m in receive(client, expected, timeout=60)]
    stats = channel_stats(daemon, TOPIC, CHANNEL)
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0), stats
    return got


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_queue_file_loses_only_its_damaged_records(tmp_path, damage):
    d = DataDir(tmp_path, ["--mem-queue-size=0", f"--max-bytes-per-file={SEGMENT}"])
    try:
        daemon = d.start()
        create_channel(daemon, TOPIC, CHANNEL)
        with RawClient(daemon.tcp) as client:
            for start in range(0, COUNT, 500):
                client.publish_many(TOPIC, [body(n) for n in range(start, start + 500)])
        d.stop()
        assert segment(tmp_path, 5).exists() and Path(str(segment(tmp_path, 1)) + ".crc").exists()
        lost = DAMAGE[damage](segment(tmp_path, 1))
        assert 0 < lost <= PER_FILE

        daemon = d.start()
        got = drain(daemon, COUNT - lost)
        assert all(intact(b) for b in got), "a damaged body was delivered"
        numbers = sorted(int(b[:6]) for b in got)
        assert len(set(numbers)) == COUNT - lost
        missing = set(range(COUNT)) - set(numbers)
        assert all(PER_FILE <= n < 2 * PER_FILE for n in missing), "only the damaged file's records are missing"
        assert channel_stats(daemon, TOPIC, CHANNEL)["damaged_count"] == lost
        text = daemon.log_text()
        assert str(segment(tmp_path, 1)) in text
        d.stop()
    finally:
        d.cleanup()


def test_a_failed_fsync_fails_the_publishes_it_covered(tmp_path):
    trigger = tmp_path / "fail-fsync"
    d = DataDir(tmp_path / "data", ["--mem-queue-size=0", "--sync-every=1"])
    try:
        from tests.integration.harness import NsqdProcess

        class Failing(NsqdProcess):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                self.env["NSQD_TEST_FAIL_FSYNC"] = str(trigger)

        daemon = d.start(Failing)
        with RawClient(daemon.tcp) as client:
            client.publish(TOPIC, b"before")
        trigger.touch()
        with RawClient(daemon.tcp) as client:
            client.send(b"PUB %s\n" % TOPIC.encode() + struct.pack(">I", 6) + b"failed")
            frame = client.read_frame(10)
            assert frame.data.startswith(b"E_PUB_FAILED"), frame
        with RawClient(daemon.tcp) as client:
            client.send(b"MPUB %s\n" % TOPIC.encode() + struct.pack(">II", 14, 1) + struct.pack(">I", 6) + b"failed")
            frame = client.read_frame(10)
            assert frame.data.startswith(b"E_MPUB_FAILED"), frame
        reply = post(http(daemon), f"/pub?topic={TOPIC}", b"failed")
        assert (reply.status, reply.json()) == (503, {"message": "EXITING"}), reply
        # the log reaches the test through a pipe: read it until the line is there
        wait_for(
            lambda: "failed" in daemon.log_text() and "injected" in daemon.log_text(),
            timeout=10,
            message="the failed fsync logged",
        )
        trigger.unlink()
        with RawClient(daemon.tcp) as client:
            client.publish(TOPIC, b"after")
        d.stop()
    finally:
        d.cleanup()
