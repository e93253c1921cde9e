"""The write-ahead log on its own: appends, reads, recovery from torn tails, refusal of damaged
synced data, segment deletion, redelivery memory; plus offsets and read-limit sharing."""

from __future__ import annotations

import importlib
import re
import struct
import zlib
from pathlib import Path

import pytest

from spark_connector import wal_pb2
from spark_connector.ranges import share as _share
from spark_connector.ranges import split as _split
from spark_connector.stream_reader import NsqPartition, arrow_batches, make_offset, parse_offset
from spark_connector.wal import SEGMENT_SUFFIX, MessageLog, WalCorruptError, WalDirectory, WalError, WalLockedError


def make_log(path: Path, segment_bytes: int = 1 << 20, dedup_window: int = 1000) -> MessageLog:
    return MessageLog(path, "127.0.0.1:4150", "t", "c", segment_bytes=segment_bytes, dedup_window=dedup_window).open()


def append(mlog: MessageLog, start: int, count: int) -> None:
    ids = [b"%016x" % i for i in range(start, start + count)]
    mlog.append(
        ids,
        [1_700_000_000_000_000_000 + i for i in range(start, start + count)],
        [1] * count,
        [b"body-%d" % i for i in range(start, start + count)],
    )
    mlog.sync()


def bodies_of(columns) -> list[bytes]:
    out, pos = [], 0
    for size in columns.body_sizes:
        out.append(columns.bodies[pos : pos + size])
        pos += size
    return out


def test_append_read_and_reopen(tmp_path):
    mlog = make_log(tmp_path)
    append(mlog, 0, 5)
    append(mlog, 5, 5)
    assert (mlog.end, mlog.synced_end) == (10, 10)
    cols = mlog.read(3, 8)
    assert bodies_of(cols) == [b"body-%d" % i for i in range(3, 8)]
    assert cols.ids == b"".join(b"%016x" % i for i in range(3, 8))
    assert list(cols.timestamps) == [1_700_000_000_000_000_000 + i for i in range(3, 8)]
    mlog.close()

    again = make_log(tmp_path)
    assert again.end == 10 and again.truncated_bytes == 0
    assert bodies_of(again.read(0, 10)) == [b"body-%d" % i for i in range(10)]
    assert again.position_of(b"%016x" % 7) == 7  # the redelivery memory survives a restart
    with pytest.raises(WalError, match="ends at position 10"):
        again.read(5, 11)


def test_unsynced_appends_are_not_readable(tmp_path):
    mlog = make_log(tmp_path)
    mlog.append([b"a" * 16], [1], [1], [b"x"])
    assert (mlog.end, mlog.synced_end) == (1, 0)
    with pytest.raises(WalError):
        mlog.read(0, 1)
    mlog.sync()
    assert bodies_of(mlog.read(0, 1)) == [b"x"]


@pytest.mark.parametrize(
    "tail", [b"\x00\x00", struct.pack(">II", 500, 7) + b"\x0a\x03abc", struct.pack(">II", 3, 0) + b"abc"]
)
def test_torn_tail_is_cut_and_appends_continue(tmp_path, tail):
    mlog = make_log(tmp_path)
    append(mlog, 0, 4)
    mlog.close()
    segment = next(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    good_size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(tail)

    recovered = make_log(tmp_path)
    assert recovered.end == 4
    assert recovered.truncated_bytes == len(tail)
    assert segment.stat().st_size == good_size
    append(recovered, 4, 2)
    recovered.close()
    final = make_log(tmp_path)
    assert final.truncated_bytes == 0
    assert bodies_of(final.read(0, 6)) == [b"body-%d" % i for i in range(6)]


def test_damage_before_valid_records_is_refused(tmp_path):
    mlog = make_log(tmp_path)
    append(mlog, 0, 3)
    append(mlog, 3, 3)
    mlog.close()
    segment = next(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the first record's payload
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match=r"bad checksum at byte 8 \(position 0\) followed by more data"):
        make_log(tmp_path)


def test_damaged_older_segment_is_refused(tmp_path):
    mlog = make_log(tmp_path, segment_bytes=64)
    for start in range(0, 9, 3):
        append(mlog, start, 3)
    mlog.close()
    segments = sorted(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    assert len(segments) == 3
    with open(segments[0], "ab") as f:
        f.write(b"\x01\x02\x03")
    with pytest.raises(WalCorruptError, match="followed by more data"):
        make_log(tmp_path)


def test_missing_segment_is_refused(tmp_path):
    mlog = make_log(tmp_path, segment_bytes=64)
    for start in range(0, 9, 3):
        append(mlog, start, 3)
    mlog.close()
    sorted(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))[1].unlink()
    with pytest.raises(WalCorruptError, match="messages are missing"):
        make_log(tmp_path)


def test_covered_segments_are_deleted(tmp_path):
    mlog = make_log(tmp_path, segment_bytes=64)
    for start in range(0, 12, 3):
        append(mlog, start, 3)
    assert mlog.segment_count() == 4
    assert mlog.delete_before(5) == 1  # [0,3) is covered; [3,6) is not entirely
    assert mlog.first_retained() == 3
    assert mlog.delete_before(100) == 2  # the newest segment stays for appends
    assert mlog.segment_count() == 1
    with pytest.raises(WalError, match="no longer holds"):
        mlog.read(0, 10)
    assert bodies_of(mlog.read(9, 12)) == [b"body-9", b"body-10", b"body-11"]


def test_redelivery_memory_is_bounded(tmp_path):
    mlog = make_log(tmp_path, dedup_window=4)
    append(mlog, 0, 6)
    assert mlog.position_of(b"%016x" % 5) == 5
    assert mlog.position_of(b"%016x" % 1) is None


def test_directory_lock_and_identity(tmp_path):
    first = WalDirectory(tmp_path, "t", "c", segment_bytes=1 << 20, dedup_window=10).open()
    try:
        with pytest.raises(WalLockedError, match="in use by another process"):
            WalDirectory(tmp_path, "t", "c", segment_bytes=1 << 20, dedup_window=10, lock_timeout=0.2).open()
        first.log_for("127.0.0.1:4150")
        first.write_committed({"version": 1, "positions": {"127.0.0.1:4150": 3}})
    finally:
        first.close()
    with pytest.raises(WalError, match="holds the log of topic 't'"):
        WalDirectory(tmp_path, "other", "c", segment_bytes=1 << 20, dedup_window=10).open()
    again = WalDirectory(tmp_path, "t", "c", segment_bytes=1 << 20, dedup_window=10).open()
    try:
        assert list(again.logs) == ["127.0.0.1:4150"]
        assert again.read_committed() == {"version": 1, "positions": {"127.0.0.1:4150": 3}}
    finally:
        again.close()


def test_offsets_have_one_shape():
    offset = make_offset({"b:2": 5, "a:1": 3, "c:3": 0})
    assert offset == {"version": 1, "positions": {"a:1": 3, "b:2": 5}}
    assert list(offset["positions"]) == ["a:1", "b:2"]
    assert parse_offset(offset) == {"a:1": 3, "b:2": 5}
    for bad in ({"positions": {}}, {"version": 2, "positions": {}}, {"version": 1, "positions": {"a": -1}}, [1]):
        with pytest.raises(WalError):
            parse_offset(bad)


@pytest.mark.parametrize(
    ("start", "available", "budget", "expected"),
    [
        ({}, {"a": 10, "b": 10}, 6, {"a": 3, "b": 3}),
        ({"a": 8}, {"a": 10, "b": 10}, 6, {"a": 10, "b": 4}),
        ({}, {"a": 2, "b": 100, "c": 1}, 9, {"a": 2, "b": 6, "c": 1}),
        ({}, {"a": 5}, 100, {"a": 5}),
        ({}, {"a": 5, "b": 5}, 1, {"a": 1, "b": 0}),
    ],
)
def test_read_limit_is_shared_between_nsqd(start, available, budget, expected):
    end = _share(start, available, budget)
    assert end == expected
    assert sum(end.values()) - sum(start.values()) == min(budget, sum(available.values()) - sum(start.values()))


@pytest.mark.parametrize(
    ("ranges", "min_partitions", "expected"),
    [
        ([("a", 0, 10)], None, [("a", 0, 10)]),
        ([("a", 0, 10)], 2, [("a", 0, 5), ("a", 5, 10)]),
        ([("a", 0, 10)], 3, [("a", 0, 4), ("a", 4, 8), ("a", 8, 10)]),
        ([("a", 4, 5)], 4, [("a", 4, 5)]),
        ([("a", 0, 9), ("b", 3, 4)], 4, [("a", 0, 3), ("a", 3, 6), ("a", 6, 9), ("b", 3, 4)]),
        ([("a", 0, 9), ("b", 3, 4)], 2, [("a", 0, 9), ("b", 3, 4)]),
    ],
)
def test_batches_are_split_into_min_partitions(ranges, min_partitions, expected):
    assert _split(ranges, min_partitions) == expected


def test_partition_becomes_arrow_batches(tmp_path):
    import pyarrow as pa

    mlog = make_log(tmp_path)
    append(mlog, 0, 7)
    part = NsqPartition("127.0.0.1:4150", "t", "c", 2, 7, mlog.read(2, 7))
    batches = list(arrow_batches(part))
    table = pa.Table.from_batches(batches)
    assert table.schema.names == ["id", "body", "timestamp", "attempts", "nsqd", "topic", "channel"]
    assert table.column("body").to_pylist() == [b"body-%d" % i for i in range(2, 7)]
    assert table.column("id").to_pylist() == [f"{i:016x}" for i in range(2, 7)]
    assert table.column("attempts").to_pylist() == [1] * 5
    assert table.column("nsqd").to_pylist() == ["127.0.0.1:4150"] * 5
    assert table.column("channel").to_pylist() == ["c"] * 5
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [(1_700_000_000_000_000_000 + i) // 1000 for i in range(2, 7)]


def test_generated_module_matches_wal_proto():
    """wal_pb2.py is committed; it must describe the fields wal.proto declares (`make spark-proto`)."""
    proto = (Path(importlib.import_module("spark_connector").__file__).parent / "wal.proto").read_text()
    declared = {
        name: int(number) for name, number in re.findall(r"^\s*(?:repeated\s+)?\w+\s+(\w+)\s*=\s*(\d+);", proto, re.M)
    }
    generated = {f.name: f.number for f in wal_pb2.Batch.DESCRIPTOR.fields}
    assert generated == declared


def test_connector_imports_from_this_checkout():
    import spark_connector

    repo = Path(__file__).resolve().parents[2]
    assert Path(spark_connector.__file__).resolve().is_relative_to(repo)
    assert spark_connector.NsqDataSource is not None and spark_connector.NsqDataSource.name() == "nsq"


def test_options_are_checked_together():
    from spark_connector.options import SourceOptions

    with pytest.raises(ValueError) as caught:
        SourceOptions.parse(
            {
                "nsqd.tcp.addresses": "nohost",
                "topic": "bad topic!",
                "ackMode": "later",
                "readMode": "driver",
                "maxMessagesPerTrigger": "0",
                "snappy": "true",
                "deflate": "true",
            }
        )
    text = str(caught.value)
    for fragment in (
        "'nohost' is not host:port",
        "not a valid NSQ topic name",
        "option channel is required",
        "option walPath is required with readMode=driver",
        "ackMode='later'",
        "maxMessagesPerTrigger=0 must be at least 1",
        "snappy and deflate are exclusive",
    ):
        assert fragment in text
    parsed = SourceOptions.parse(
        {
            "NSQD.TCP.ADDRESSES": "127.0.0.1:4150, 127.0.0.2:4150",
            "Topic": "t",
            "channel": "c#ephemeral",
            "walpath": "/tmp/w",
            "maxInFlight": "10",
        }
    )
    assert parsed.nsqd_addresses == ("127.0.0.1:4150", "127.0.0.2:4150")
    assert (parsed.ack_mode, parsed.max_in_flight, parsed.max_messages_per_trigger) == ("durable", 10, None)


def test_records_are_batch_protobufs_in_the_packed_layout(tmp_path):
    mlog = make_log(tmp_path)
    append(mlog, 0, 3)
    mlog.close()
    data = next(tmp_path.glob(f"*{SEGMENT_SUFFIX}")).read_bytes()
    length, _crc = struct.unpack_from(">II", data, 8)
    batch = wal_pb2.Batch.FromString(data[16 : 16 + length])
    assert (batch.first_position, batch.nsqd, batch.topic, batch.channel) == (0, "127.0.0.1:4150", "t", "c")
    assert batch.ids == b"".join(b"%016x" % i for i in range(3))
    assert struct.unpack("<3q", batch.timestamps_le) == tuple(1_700_000_000_000_000_000 + i for i in range(3))
    assert struct.unpack("<3H", batch.attempts_le) == (1, 1, 1)
    assert struct.unpack("<3I", batch.body_sizes_le) == (6, 6, 6)
    assert batch.bodies == b"body-0body-1body-2"
    assert not batch.timestamps and not batch.attempts and not batch.body_sizes


def test_logs_of_the_repeated_layout_are_replayed(tmp_path):
    """A log written with one varint per message and field is read back, and appends continue
    after it in the packed layout."""
    tmp_path.mkdir(exist_ok=True)
    payload = wal_pb2.Batch(
        first_position=0,
        nsqd="127.0.0.1:4150",
        topic="t",
        channel="c",
        ids=b"".join(b"%016x" % i for i in range(3)),
        timestamps=[10, 11, 12],
        attempts=[1, 2, 3],
        body_sizes=[1, 2, 3],
        bodies=b"abbccc",
    ).SerializeToString()
    (tmp_path / f"{0:020d}{SEGMENT_SUFFIX}").write_bytes(
        b"TNSQWAL1" + struct.pack(">II", len(payload), zlib.crc32(payload)) + payload
    )
    mlog = make_log(tmp_path)
    assert (mlog.end, mlog.truncated_bytes) == (3, 0)
    assert mlog.position_of(b"%016x" % 2) == 2
    append(mlog, 3, 2)
    cols = mlog.read(1, 5)
    assert bodies_of(cols) == [b"bb", b"ccc", b"body-3", b"body-4"]
    assert list(cols.timestamps) == [11, 12, 1_700_000_000_000_000_003, 1_700_000_000_000_000_004]
    assert list(cols.attempts) == [2, 3, 1, 1]


def test_record_with_columns_of_different_lengths_is_undecodable(tmp_path):
    mlog = make_log(tmp_path)
    append(mlog, 0, 2)
    mlog.close()
    payload = wal_pb2.Batch(
        first_position=2,
        nsqd="127.0.0.1:4150",
        topic="t",
        channel="c",
        ids=b"%016x" % 2,
        timestamps_le=struct.pack("<2q", 1, 2),
        attempts_le=b"\x01\x00",
        body_sizes_le=b"\x01\x00\x00\x00",
        bodies=b"x",
    ).SerializeToString()
    segment = next(tmp_path.glob(f"*{SEGMENT_SUFFIX}"))
    with open(segment, "ab") as f:
        f.write(struct.pack(">II", len(payload), zlib.crc32(payload)) + payload)
    recovered = make_log(tmp_path)  # a torn tail: cut, as nothing in it was acknowledged
    assert recovered.end == 2 and recovered.truncated_bytes > 0


def test_redelivery_lookups_across_records(tmp_path):
    """Ids are looked up however they compare with the newest: a copy of an old message is found,
    an id below the greatest one that was never logged (a deferred message) is not."""
    mlog = make_log(tmp_path, dedup_window=6)
    mlog.append([b"%016x" % i for i in (10, 12, 14)], [0] * 3, [1] * 3, [b"a"] * 3)
    assert mlog.position_of(b"%016x" % 12) == 1
    assert mlog.position_of(b"%016x" % 11) is None
    assert mlog.position_of(b"%016x" % 99) is None
    mlog.append([b"%016x" % i for i in (16, 11, 18)], [0] * 3, [1] * 3, [b"a"] * 3)
    assert [mlog.position_of(b"%016x" % i) for i in (10, 11, 16, 18)] == [0, 4, 3, 5]
    mlog.append([b"%016x" % i for i in (20, 22)], [0] * 2, [1] * 2, [b"a"] * 2)
    assert mlog.position_of(b"%016x" % 22) == 7
    assert mlog.position_of(b"%016x" % 14) == 2  # within the last 6
