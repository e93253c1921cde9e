"""nsqd/queues/offset_log.py: offsets dense and kept across reopening, ranges with a byte cap, LSEEK, commits
and the files they remove, retention by time and bytes, and damaged files found at opening (torn tail, a
flipped byte, a missing segment): reported with file and byte, the readable part served, nothing after it."""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path

import pytest

from nsqd.queues.offset_log import CHUNK_HEADER, LogRangeError, OffsetLog
from protocol.log import Columns, decode_range

NAME = "t:c"


def batch(start: int, count: int, *, stamp: int = 1000, size: int = 8) -> Columns:
    return Columns.from_messages(
        [b"%016d" % i for i in range(start, start + count)],
        [stamp + i for i in range(start, start + count)],
        [i % 3 for i in range(count)],
        [(b"%d-" % i).ljust(size, b"x") for i in range(start, start + count)],
    )


def bodies(data: bytes) -> list[bytes]:
    return [m[4] for m in decode_range(data).messages()]


def expected(a: int, b: int, size: int = 8) -> list[bytes]:
    return [(b"%d-" % i).ljust(size, b"x") for i in range(a, b)]


def open_log(path, **kwargs) -> OffsetLog:
    kwargs.setdefault("max_bytes_per_file", 1000)
    return OffsetLog(str(path), NAME, **kwargs).open()


@pytest.fixture(params=[False, True], ids=["buffered", "durable"])
def durable(request):
    return request.param


def test_offsets_are_dense_and_survive_reopening(tmp_path, durable):
    log = open_log(tmp_path, durable=durable)
    assert log.offsets() == (0, 0, 0)
    assert log.append(batch(0, 10)) == 0
    assert log.append(batch(10, 50)) == 10
    assert log.offsets() == (0, 0, 60)
    assert bodies(log.read(0, 60, 1 << 20)) == expected(0, 60)
    log.close()
    if durable:  # (buffered, both appends were written as one chunk)
        assert len([n for n in os.listdir(tmp_path) if n.endswith(".dat")]) > 1  # several segments
    log = open_log(tmp_path, durable=durable)
    assert log.offsets() == (0, 0, 60)
    assert log.append(batch(60, 1)) == 60
    assert bodies(log.read(5, 61, 1 << 20)) == expected(5, 61)


def test_durable_appends_are_in_the_files_at_once(tmp_path):
    log = open_log(tmp_path, durable=True)
    log.append(batch(0, 3))
    again = open_log(tmp_path)  # another reader of the same files, as after a kill -9
    assert again.end == 3


def test_buffered_appends_reach_the_files_at_the_periodic_sync(tmp_path):
    active = {}
    log = open_log(tmp_path, active=active)
    log.append(batch(0, 3))
    assert (
        log in active
        and open_log(
            tmp_path / "..",
        )
        is not None
    )
    assert OffsetLog(str(tmp_path), NAME).open().end == 0
    log.sync_if_due(0.0)
    assert OffsetLog(str(tmp_path), NAME).open().end == 3


def test_read_caps_bytes_but_returns_one_message_at_least(tmp_path):
    log = open_log(tmp_path, max_bytes_per_file=1 << 20)
    log.append(batch(0, 100, size=100))
    one = decode_range(log.read(0, 100, 10))
    assert (one.first, one.count, one.end) == (0, 1, 100)
    part = decode_range(log.read(5, 100, 24 + 3 * 130))
    assert (part.first, part.count) == (5, 3)
    assert decode_range(log.read(100, 100, 1000)).count == 0


def test_range_errors(tmp_path):
    log = open_log(tmp_path)
    log.append(batch(0, 10))
    log.commit(4)
    for args, kind, offset, bound in [
        ((5, 4), "bad_range", 5, 4),
        ((5, 11), "past_end", 11, 10),
        ((3, 5), "before_start", 3, 4),
    ]:
        with pytest.raises(LogRangeError) as info:
            log.read(*args, 1000)
        assert (info.value.kind, info.value.offset, info.value.bound) == (kind, offset, bound)
    with pytest.raises(LogRangeError):
        log.commit(11)


def test_commit_is_idempotent_and_kept(tmp_path, durable):
    log = open_log(tmp_path, durable=durable)
    log.append(batch(0, 60))
    assert log.commit(30) is True
    assert log.commit(30) is False and log.commit(10) is False
    assert log.offsets() == (30, 30, 60) and log.depth() == 30
    log.close()
    log = open_log(tmp_path, durable=durable)
    assert log.offsets() == (30, 30, 60)
    assert bodies(log.read(30, 60, 1 << 20)) == expected(30, 60)


def test_committed_segments_are_removed_without_retention(tmp_path):
    log = open_log(tmp_path, durable=True)
    log.append(batch(0, 20))
    log.append(batch(20, 20))
    log.append(batch(40, 20))
    segments = sorted(n for n in os.listdir(tmp_path) if n.endswith(".dat"))
    assert len(segments) == 3
    log.commit(45)
    left = sorted(n for n in os.listdir(tmp_path) if n.endswith(".dat"))
    assert left == segments[2:]  # the one holding 45 stays
    log.commit(60)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".dat")]
    assert log.append(batch(60, 1)) == 60


def test_retention_by_bytes_keeps_the_newest_committed_segments(tmp_path):
    log = open_log(tmp_path, durable=True, retention_bytes=1000)
    for k in range(5):
        log.append(batch(20 * k, 20))
    size = os.path.getsize(os.path.join(tmp_path, f"{NAME}.log.{0:020d}.dat"))
    assert 500 < size < 1000
    log.commit(80)
    assert log.offsets() == (60, 80, 100)  # one segment's bytes kept, the rest removed
    assert bodies(log.read(60, 100, 1 << 20)) == expected(60, 100)
    log.close()
    assert open_log(tmp_path, retention_bytes=1000).offsets() == (60, 80, 100)
    assert open_log(tmp_path).offsets() == (80, 80, 100)  # no retention: removed at opening


def test_retention_by_time(tmp_path):
    now = time.time_ns()
    log = open_log(tmp_path, durable=True, retention_time=10.0)
    log.append(batch(0, 20, stamp=now - 100 * 10**9))
    log.append(batch(20, 20, stamp=now))
    log.append(batch(40, 20, stamp=now))
    log.commit(60)  # the first segment's newest message is older than 10 s: removed
    assert log.offsets() == (20, 60, 60)
    assert log.apply_retention(now_ns=now + 5 * 10**9) == 0
    assert log.apply_retention(now_ns=now + 11 * 10**9) == 2
    assert log.offsets() == (60, 60, 60)


def test_uncommitted_segments_are_never_removed(tmp_path):
    log = open_log(tmp_path, durable=True, retention_bytes=1, retention_time=0.001)
    for k in range(3):
        log.append(batch(20 * k, 20, stamp=1))
    log.commit(19)
    assert log.apply_retention() == 0
    assert bodies(log.read(19, 60, 1 << 20)) == expected(19, 60)


def test_seek_by_time(tmp_path):
    log = open_log(tmp_path, durable=True)
    log.append(batch(0, 30, stamp=1000))  # 1000..1029
    log.append(batch(30, 5, stamp=0))  # late, old stamps: 30..34
    log.append(batch(35, 30, stamp=1000))  # 1035..1064
    assert log.seek(0) == 0
    assert log.seek(1010) == 10
    assert log.seek(1032) == 35
    assert log.seek(5000) == log.end
    log.commit(20)
    assert log.seek(0) == 20  # never below start


def test_ids_between_for_replication(tmp_path):
    log = open_log(tmp_path)
    log.append(batch(0, 30))
    assert log.ids_between(5, 8) == [b"%016d" % i for i in range(5, 8)]


def _segment(tmp_path, first: int) -> str:
    return os.path.join(tmp_path, f"{NAME}.log.{first:020d}.dat")


def _three_chunks(tmp_path) -> list[int]:
    """Three chunks in one segment; returns the byte position of each chunk."""
    log = open_log(tmp_path, durable=True, max_bytes_per_file=1 << 20)
    log.append(batch(0, 5))
    log.append(batch(5, 5))
    log.append(batch(10, 5))
    log.close()
    data = Path(_segment(tmp_path, 0)).read_bytes()
    positions, pos = [], 0
    while pos < len(data):
        positions.append(pos)
        pos += struct.unpack_from(">I", data, pos)[0]
    return positions


def test_torn_tail_is_reported_and_the_rest_served(tmp_path, caplog):
    positions = _three_chunks(tmp_path)
    path = _segment(tmp_path, 0)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)  # the last chunk cut short, as by a kill during its write
    with caplog.at_level(logging.ERROR, logger="nsqd"):
        log = open_log(tmp_path)
    assert f"{path}: bad chunk at byte {positions[2]}" in caplog.text
    assert "the log ends at offset 10" in caplog.text
    assert log.offsets() == (0, 0, 10)
    assert bodies(log.read(0, 10, 1 << 20)) == expected(0, 10)
    assert os.path.getsize(path) == positions[2]  # the torn part is cut off
    assert log.append(batch(10, 2)) == 10  # offsets go on from the readable part
    assert bodies(log.read(8, 12, 1 << 20)) == expected(8, 12)


@pytest.mark.parametrize("where", ["header", "body"])
def test_a_flipped_byte_ends_the_log_there(tmp_path, caplog, where):
    positions = _three_chunks(tmp_path)
    path = _segment(tmp_path, 0)
    at = positions[1] + (9 if where == "header" else CHUNK_HEADER + 3)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    with caplog.at_level(logging.ERROR, logger="nsqd"):
        log = open_log(tmp_path)
    assert f"{path}: bad chunk at byte {positions[1]} (checksum mismatch)" in caplog.text
    assert log.end == 5
    assert bodies(log.read(0, 5, 1 << 20)) == expected(0, 5)
    with pytest.raises(LogRangeError):
        log.read(0, 6, 1 << 20)


def test_later_segments_after_a_damaged_one_are_moved_aside(tmp_path, caplog):
    log = open_log(tmp_path, durable=True)
    for k in range(3):
        log.append(batch(20 * k, 20))
    log.close()
    second = _segment(tmp_path, 20)
    with open(second, "r+b") as f:
        f.truncate(10)
    with caplog.at_level(logging.ERROR, logger="nsqd"):
        log = open_log(tmp_path)
    assert f"{second}: bad chunk at byte 0" in caplog.text
    assert log.end == 20
    assert os.path.exists(_segment(tmp_path, 40) + ".bad")
    assert bodies(log.read(0, 20, 1 << 20)) == expected(0, 20)


def test_files_lost_below_the_committed_offset(tmp_path, caplog):
    log = open_log(tmp_path, durable=True)
    log.append(batch(0, 20))
    log.commit(10)
    log.close()
    os.remove(_segment(tmp_path, 0))  # e.g. a buffered run killed before its data reached the file
    with caplog.at_level(logging.WARNING, logger="nsqd"):
        log = open_log(tmp_path)
    assert log.offsets() == (10, 10, 10)
    assert log.append(batch(10, 1)) == 10


def test_delete_removes_every_file(tmp_path):
    log = open_log(tmp_path)
    log.append(batch(0, 50))
    log.flush()
    log.delete()
    assert os.listdir(tmp_path) == []
    assert not OffsetLog.exists(str(tmp_path), NAME)


def test_messages_given_again_after_reopening_are_not_appended_twice(tmp_path, caplog):
    log = open_log(tmp_path, durable=True)
    log.append(batch(0, 10))
    log.close()
    log = open_log(tmp_path, durable=True)  # the topic copies its last batch again after a kill -9
    with caplog.at_level(logging.INFO, logger="nsqd"):
        assert log.append(batch(5, 7)) == 10
    assert "5 message(s) given again" in caplog.text
    assert log.end == 12
    assert bodies(log.read(0, 12, 1 << 20)) == expected(0, 12)
