"""DiskQueue with checksums: the side file per segment, damage found and never delivered, the rest kept."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from nsqd.queues.checksums import ENTRY, crc_of, side_file_name
from nsqd.queues.diskqueue import DiskQueue
from nsqd.queues.span import QueueSpan

from .test_diskqueue import NAME, data_file, message, read_all

pytestmark = pytest.mark.filterwarnings("ignore")


class Queue(DiskQueue):
    """A queue with checksums that notes what it reports through ``on_damage``."""

    __slots__ = ("damage_calls",)

    def __init__(self, path, **kwargs) -> None:
        self.damage_calls: list[int] = []
        super().__init__(NAME, str(path), checksums=True, on_damage=lambda q, n: self.damage_calls.append(n), **kwargs)


queue = Queue


def written(path, records: list[bytes], **kwargs) -> list[bytes]:
    """``records`` put into a new queue at ``path``, which is closed."""
    q = queue(path, **kwargs)
    q.put_many(records)
    q.close()
    return records


def offsets(records: list[bytes]) -> list[int]:
    out, pos = [], 0
    for r in records:
        out.append(pos)
        pos += 4 + len(r)
    return out


def test_side_file_lists_every_record(tmp_path):
    records = [message(n) for n in range(10)]
    q = queue(tmp_path)
    q.put_many(records[:6])
    q.put(records[6])
    q.put_many(records[7:])
    q.close()
    data = data_file(tmp_path, 0).read_bytes()
    side = Path(side_file_name(str(data_file(tmp_path, 0)))).read_bytes()
    assert len(side) == 10 * ENTRY.size
    for i, pos in enumerate(offsets(records)):
        length, crc = ENTRY.unpack_from(side, i * 8)
        assert length == len(records[i])
        assert crc == crc_of(data[pos : pos + 4 + length])
    q = queue(tmp_path)
    assert read_all(q) == records and q.damaged == 0
    q.close()


@pytest.mark.parametrize("split", [False, True])
def test_a_flipped_body_byte_is_never_delivered(tmp_path, caplog, split):
    records = written(tmp_path, [message(n) for n in range(10)])
    path = data_file(tmp_path, 0)
    data = bytearray(path.read_bytes())
    at = offsets(records)[4]
    data[at + 4 + 100] ^= 0x01
    path.write_bytes(bytes(data))
    q = queue(tmp_path)
    if split:
        got = q.read_split(100)
        assert [b[:8] for b in got.bodies] == [b"%08d" % n for n in range(10) if n != 4]
    else:
        assert read_all(q) == records[:4] + records[5:]
    assert q.damaged == 1 and q.damage_calls == [1] and q.depth() == 0
    assert f"damaged record at byte {at} of {path}" in caplog.text and "checksum mismatch" in caplog.text
    q.close()


def test_an_overwritten_size_field_costs_one_record_not_the_file(tmp_path, caplog):
    records = written(tmp_path, [message(n) for n in range(10)])
    path = data_file(tmp_path, 0)
    data = bytearray(path.read_bytes())
    at = offsets(records)[3]
    data[at : at + 4] = struct.pack(">i", 0x7FFF0000)
    path.write_bytes(bytes(data))
    q = queue(tmp_path)
    assert read_all(q) == records[:3] + records[4:]
    assert q.damaged == 1 and "size field" in caplog.text
    assert not (tmp_path / (path.name + ".bad")).exists()
    q.close()


def test_a_segment_cut_short_counts_what_it_lost_and_the_next_file_is_read(tmp_path, caplog):
    records = [message(n, body_size=74) for n in range(12)]  # 104 bytes framed, 4 per file
    q = queue(tmp_path, max_bytes_per_file=420)
    q.put_many(records)
    q.close()
    path = data_file(tmp_path, 0)
    os.truncate(path, int(path.stat().st_size * 0.4))  # 166 bytes: record 0 whole, 1 cut
    q = queue(tmp_path, max_bytes_per_file=420)
    assert read_all(q) == [records[0]] + records[4:]
    assert q.damaged == 3 and sum(q.damage_calls) == 3 and q.depth() == 0
    q.close()


def test_a_deleted_segment_counts_its_records(tmp_path, caplog):
    records = written(tmp_path, [message(n, body_size=74) for n in range(12)], max_bytes_per_file=420)
    os.remove(data_file(tmp_path, 1))
    q = queue(tmp_path, max_bytes_per_file=420)
    assert read_all(q) == records[:4] + records[8:]
    assert q.damaged == 4 and "missing" in caplog.text
    q.close()


def test_a_segment_without_side_file_reads_as_nsqd_wrote_it(tmp_path, caplog):
    records = written(tmp_path, [message(n) for n in range(6)])
    os.remove(side_file_name(str(data_file(tmp_path, 0))))
    q = queue(tmp_path)
    assert read_all(q) == records and q.damaged == 0
    q.put_many([message(7)])  # the write file moved on: the new one is checked
    assert read_all(q) == [message(7)]
    q.close()


def test_checksums_continue_across_a_restart_and_a_failed_write(tmp_path):
    records = [message(n) for n in range(8)]
    q = queue(tmp_path)
    q.put_many(records[:3])
    assert q.read_many(2) == records[:2]
    q.close()
    q = queue(tmp_path)  # the write file goes on where it stopped: the entries too
    q.put_many(records[3:])
    q.close()
    path = data_file(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[offsets(records)[6] + 60] ^= 0xFF
    path.write_bytes(bytes(data))
    q = queue(tmp_path)
    assert read_all(q) == records[2:6] + records[7:]
    assert q.damaged == 1
    q.close()


def test_hold_mode_steps_over_a_damaged_record(tmp_path):
    records = written(tmp_path, [message(n) for n in range(6)], hold_reads=True, sync_every=1)
    path = data_file(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[offsets(records)[2] + 50] ^= 0x10
    path.write_bytes(bytes(data))
    q = queue(tmp_path, hold_reads=True, sync_every=1)
    token, got = q.read_many_held(10)
    assert got == records[:2] + records[3:]
    q.close()
    q = queue(tmp_path, hold_reads=True, sync_every=1)  # nothing acknowledged: all read again, damage again
    token, got = q.read_many_held(10)
    assert got == records[:2] + records[3:] and q.damaged == 1
    q.ack_range(token, 5)
    q.close()
    q = queue(tmp_path, hold_reads=True, sync_every=1)
    assert q.read_many(10) == [] and q.depth() == 0
    q.close()


@pytest.mark.parametrize("roll", [False, True], ids=["still written", "rolled meanwhile"])
def test_a_span_of_the_write_file_takes_records_appended_later_for_no_loss(tmp_path, caplog, roll):
    # a backfill reads a span while publishes go on: the side file then lists records past the span's end, which
    # were appended after it, not lost (they made every backfill under load ask its replica for copies)
    q = queue(tmp_path, max_bytes_per_file=1000)
    records = [message(n, body_size=74) for n in range(12)]  # 104 bytes framed, 9 per file
    q.put_many(records[:5])
    span = QueueSpan(q)
    q.put_many(records[5:12] if roll else records[5:8])
    assert q.write_position()[0] == (1 if roll else 0)
    got = [r for batch in span.records(100, split=False) for r in batch]
    assert got == records[:5]
    assert (span.found, span.damaged, bool(span.lost)) == (False, 0, False)
    assert "lost" not in caplog.text
    q.close()


def test_a_span_names_the_records_a_write_file_cut_short_lost(tmp_path, caplog):
    q = queue(tmp_path)
    records = [message(n, body_size=74) for n in range(6)]
    q.put_many(records)
    span = QueueSpan(q)
    os.truncate(data_file(tmp_path, 0), 104 * 4)  # the last two records gone
    got = [r for batch in span.records(100, split=False) for r in batch]
    assert got == records[:4]
    assert (span.found, span.damaged) == (True, 2)
    # the entries name the records lost: a copy of one from elsewhere is told apart from any other message
    assert not span.lost.claim(*_copy(records[3]))
    assert all(span.lost.claim(*_copy(record)) for record in records[4:])
    assert not span.lost
    q.close()


def test_the_queue_names_what_it_lost_for_the_copies_to_match(tmp_path, caplog):
    records = [message(n, body_size=74, attempts=3) for n in range(12)]
    q = queue(tmp_path, max_bytes_per_file=420)
    q.put_many(records)
    q.close()
    os.truncate(data_file(tmp_path, 0), int(data_file(tmp_path, 0).stat().st_size * 0.4))
    q = queue(tmp_path, max_bytes_per_file=420)
    read_all(q)
    lost = q.take_lost()
    assert len(lost.entries) == 3 and not lost.unknown and not q.lost
    assert not lost.claim(*_copy(records[0])) and not lost.claim(*_copy(records[4]))
    # a copy may know fewer attempts than the record was written with (0 here, 3 there): those beyond are tried
    assert all(lost.claim(*_copy(record)) for record in records[1:4])
    assert not lost
    lost.add([ENTRY.unpack(ENTRY.pack(len(records[1]), crc_of(struct.pack(">i", len(records[1])) + records[1])))])
    assert not lost, "an entry claimed once is not lost again when the same damage is found again"
    q.close()


def _copy(record: bytes) -> tuple[bytes, int, int, bytes]:
    """``LostRecords.claim``'s arguments for a copy of ``record``'s message that knows no attempts."""
    timestamp, _attempts, msg_id = struct.unpack_from(">qH16s", record)
    return msg_id, timestamp, 0, record[26:]
