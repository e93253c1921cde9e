"""DiskQueue: round trips, segment files, restarts, corruption, the exact on-disk format, disk errors."""

from __future__ import annotations

import logging
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nsqd.queues.diskqueue import DiskQueue, DiskQueueClosed

REPO = Path(__file__).resolve().parents[2]
NAME = "orders"


def message(n: int, body_size: int = 200, attempts: int = 0) -> bytes:
    """A record as nsqd writes it: int64 ns timestamp, uint16 attempts, 16 hex ASCII id bytes, then the body."""
    body = (b"%08d" % n) + b"x" * (body_size - 8)
    return struct.pack(">qH16s", 1_700_000_000_000_000_000 + n, attempts, b"%016x" % (0x18A398C44E669000 + n)) + body


def framed(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(r)) + r for r in records)


def data_file(path: Path, num: int, name: str = NAME) -> Path:
    return path / f"{name}.diskqueue.{num:06d}.dat"


def meta_file(path: Path, name: str = NAME) -> Path:
    return path / f"{name}.diskqueue.meta.dat"


def queue_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if not p.name.endswith(".tmp"))


def read_all(q: DiskQueue, batch: int = 7) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(100_000):
        got = q.read_many(batch)
        if not got:
            return out
        out.extend(got)
    raise AssertionError("read_many never ran dry")


def independent_read(path: Path, name: str = NAME) -> list[bytes]:
    """A minimal reader written from the format alone: meta positions, then [int32 length][payload] records."""
    depth_line, read_line, write_line, tail = meta_file(path, name).read_text("ascii").split("\n")
    assert tail == ""
    read_num, read_pos = map(int, read_line.split(","))
    write_num, write_pos = map(int, write_line.split(","))
    records = []
    for num in range(read_num, write_num + 1):
        file = data_file(path, num, name)
        blob = file.read_bytes() if file.exists() else b""
        pos = read_pos if num == read_num else 0
        end = write_pos if num == write_num else len(blob)
        while pos < end:
            (size,) = struct.unpack_from(">i", blob, pos)
            records.append(blob[pos + 4 : pos + 4 + size])
            pos += 4 + size
        assert pos == end
    assert len(records) == int(depth_line)
    return records


# -- basics ------------------------------------------------------------------------------------
def test_round_trip(tmp_path):
    q = DiskQueue(NAME, str(tmp_path))
    assert q.depth() == 0 and q.read_many(10) == [] and not q.has_unread()
    q.put(message(0))
    q.put_many([message(1), message(2, body_size=0), message(3, body_size=5000)])
    assert q.depth() == 4 and q.has_unread()
    assert q.read_many(3) == [message(0), message(1), message(2, body_size=0)]
    assert q.depth() == 1
    q.put(message(4))
    assert q.read_many(10) == [message(3, body_size=5000), message(4)]
    assert q.depth() == 0 and q.read_many(10) == [] and not q.has_unread()
    q.close()
    with pytest.raises(DiskQueueClosed):
        q.put(message(5))


@pytest.mark.skipif(not hasattr(os, "O_NOATIME"), reason="O_NOATIME is Linux's")
def test_segments_are_read_without_access_time_updates(tmp_path):
    q = DiskQueue(NAME, str(tmp_path))
    q.put_many([message(0), message(1)])
    assert q.read_many(1) == [message(0)]
    path = os.path.realpath(data_file(tmp_path, 0))  # as /proc shows descriptors' files
    read_flags = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == path:
            with open(f"/proc/self/fdinfo/{fd}") as info:
                flags = int(next(line for line in info if line.startswith("flags:")).split()[1], 8)
            if flags & os.O_ACCMODE == os.O_RDONLY:
                read_flags.append(flags)
    assert len(read_flags) == 1 and read_flags[0] & os.O_NOATIME
    q.close()


def test_size_limits_are_checked_before_anything_is_written(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_msg_size=26 + 100)
    with pytest.raises(ValueError):
        q.put(b"x" * 25)
    with pytest.raises(ValueError):
        q.put(b"x" * 127)
    with pytest.raises(ValueError):
        q.put_many([message(0, body_size=10), b"short"])
    assert q.depth() == 0
    assert not data_file(tmp_path, 0).exists() or data_file(tmp_path, 0).stat().st_size == 0
    q.put(b"x" * 26)
    q.put(b"y" * 126)
    assert q.read_many(5) == [b"x" * 26, b"y" * 126]
    q.close()


def test_files_roll_at_the_right_byte_and_read_files_are_deleted(tmp_path):
    record = message(0, body_size=70)  # 96 bytes, 100 with its length
    assert len(record) == 96
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=350)
    records = [message(n, body_size=70) for n in range(10)]
    q.put_many(records[:4])  # 3 fit in 350 bytes (300), the 4th opens file 1
    q.put(records[4])
    for record in records[5:]:
        q.put(record)
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.name.endswith(".dat") and "meta" not in p.name}
    assert sizes == {
        f"{NAME}.diskqueue.000000.dat": 300,
        f"{NAME}.diskqueue.000001.dat": 300,
        f"{NAME}.diskqueue.000002.dat": 300,
        f"{NAME}.diskqueue.000003.dat": 100,
    }
    assert q.depth() == 10
    q.wait_idle()  # file work runs on a thread (see test_diskqueue_worker.py)
    # the meta was synced at every roll, before the new file got data
    assert meta_file(tmp_path).read_text() == "9\n0,0\n3,0\n"
    assert q.read_many(2) == records[:2]
    assert data_file(tmp_path, 0).exists()
    assert q.read_many(1) == records[2:3]
    q.wait_idle()
    assert not data_file(tmp_path, 0).exists()  # deleted as soon as its last record was read
    assert q.read_many(5) == records[3:8]
    q.wait_idle()
    assert not data_file(tmp_path, 1).exists() and data_file(tmp_path, 2).exists()
    assert q.read_many(5) == records[8:]
    q.wait_idle()
    assert not data_file(tmp_path, 2).exists()
    assert q.depth() == 0
    assert data_file(tmp_path, 3).exists()  # the write file stays
    q.close()
    assert meta_file(tmp_path).read_text() == "0\n3,100\n3,100\n"


def test_a_record_larger_than_a_file_gets_a_file_of_its_own(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=100)
    big, small = message(1, body_size=300), message(2, body_size=10)
    q.put_many([small, big, small])
    assert [data_file(tmp_path, n).stat().st_size for n in range(3)] == [40, 330, 40]
    assert read_all(q) == [small, big, small]
    q.close()


def test_put_many_is_one_write_call(tmp_path, monkeypatch):
    q = DiskQueue(NAME, str(tmp_path))
    calls = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd, data, offset):
        calls.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    records = [b"r" * 200] * 200
    q.put_many(records)
    assert calls == [200 * 204]
    assert q.read_many(500) == records
    q.close()


def test_reader_caught_up_when_the_writer_rolls_is_not_corruption(tmp_path, caplog):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    records = [message(n, body_size=74) for n in range(6)]  # 104 bytes with the length: 2 per file
    for record in records:
        q.put(record)
        assert q.read_many(10) == [record]  # the reader sits exactly at the writer each time
    assert q.depth() == 0
    q.wait_idle()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".bad")]
    assert queue_files(tmp_path) == [data_file(tmp_path, 2).name, meta_file(tmp_path).name]
    assert "corrupt" not in caplog.text and ".bad" not in caplog.text
    q.close()


# -- restarts ----------------------------------------------------------------------------------
def test_restart_mid_segment_continues_exactly_where_it_stopped(tmp_path):
    records = [message(n, body_size=50) for n in range(25)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=400)
    q.put_many(records)
    assert q.read_many(9) == records[:9]
    q.close()
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=400)
    assert q.depth() == 16
    assert q.read_many(4) == records[9:13]
    q.put(message(99))
    q.close()
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=400)
    assert q.depth() == 13
    assert read_all(q) == records[13:] + [message(99)]
    assert q.depth() == 0
    q.close()


def test_restart_with_a_write_file_longer_than_the_meta(tmp_path, caplog):
    records = [message(n) for n in range(6)]
    q = DiskQueue(NAME, str(tmp_path))
    q.put_many(records[:3])
    q.sync()
    synced_meta = meta_file(tmp_path).read_bytes()
    q.put_many(records[3:])
    q.close()
    meta_file(tmp_path).write_bytes(synced_meta)  # as if the process died before the next sync

    caplog.set_level(logging.WARNING)
    q = DiskQueue(NAME, str(tmp_path))
    assert "unsynced" in caplog.text
    assert q.depth() == 6  # the three records after the recorded position are counted
    q.put(message(6))
    assert data_file(tmp_path, 1).stat().st_size == 4 + len(message(6))  # writing moved to a new file
    assert data_file(tmp_path, 0).stat().st_size == 6 * (4 + len(records[0]))  # the old one was not touched
    assert read_all(q) == records + [message(6)]
    assert q.depth() == 0
    q.close()


def test_truncated_last_record(tmp_path, caplog):
    records = [message(n) for n in range(4)]
    q = DiskQueue(NAME, str(tmp_path))
    q.put_many(records[:2])
    q.sync()
    synced_meta = meta_file(tmp_path).read_bytes()
    q.put_many(records[2:])
    q.close()
    # a crash in the middle of the last write: the meta predates records 2 and 3, and 3 is cut short
    meta_file(tmp_path).write_bytes(synced_meta)
    file0 = data_file(tmp_path, 0)
    os.truncate(file0, file0.stat().st_size - 50)

    q = DiskQueue(NAME, str(tmp_path))
    assert q.depth() == 3  # only the whole record 2 is salvaged
    q.put(message(7))
    assert read_all(q) == records[:3] + [message(7)]
    assert (tmp_path / (file0.name + ".bad")).exists()
    assert "short read" in caplog.text
    assert q.depth() == 0
    q.close()


def test_write_file_shorter_than_the_meta(tmp_path, caplog):
    records = [message(n) for n in range(3)]
    q = DiskQueue(NAME, str(tmp_path))
    q.put_many(records)
    q.close()
    file0 = data_file(tmp_path, 0)
    os.truncate(file0, file0.stat().st_size - 10)
    q = DiskQueue(NAME, str(tmp_path))
    assert q.depth() == 3
    assert read_all(q) == records[:2]
    assert q.depth() == 0  # forced at the tail
    assert "data loss" in caplog.text
    assert (tmp_path / (file0.name + ".bad")).exists()
    q.put(message(9))
    assert q.read_many(5) == [message(9)]
    q.close()


def test_kill_9_loses_no_acknowledged_record_with_sync_every_1(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from nsqd.queues.diskqueue import DiskQueue
        q = DiskQueue("{NAME}", {str(tmp_path)!r}, sync_every=1, max_bytes_per_file=2000)
        n = 0
        while True:
            q.put(b"%026d" % n + b"b" * 100)
            if n % 3 == 0:
                q.read_many(1)
            print(n, flush=True)
            n += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        acked = [int(proc.stdout.readline()) for _ in range(60)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert acked == list(range(60))
    q = DiskQueue(NAME, str(tmp_path), sync_every=1, max_bytes_per_file=2000)
    got = [int(r[:26]) for r in read_all(q)]
    # The writer put n and then, every third time, consumed the oldest record. Every acknowledged record that
    # was not consumed must be there, in order; a consumed one may come back (at least once).
    assert got == list(range(got[0], got[-1] + 1))
    assert got[-1] >= 59
    assert got[0] <= got[-1] // 3 + 1
    q.close()


# -- corruption --------------------------------------------------------------------------------
def test_corrupt_length_renames_the_file_and_moves_on(tmp_path, caplog):
    records = [message(n, body_size=50) for n in range(9)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)  # 80 bytes per record: 3 per file
    q.put_many(records)
    q.close()
    file1 = data_file(tmp_path, 1)
    blob = bytearray(file1.read_bytes())
    blob[80:84] = struct.pack(">i", 5)  # the second record of file 1 claims 5 bytes: below the minimum
    file1.write_bytes(bytes(blob))

    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    got = read_all(q, batch=100)
    assert got == records[:4] + records[6:]
    assert (tmp_path / (file1.name + ".bad")).exists()
    assert "invalid record size 5" in caplog.text
    assert "data loss" in caplog.text and q.depth() == 0  # 2 records were lost: forced to 0 at the tail
    q.close()


def test_corrupt_write_file_moves_the_writer_on(tmp_path):
    records = [message(n) for n in range(3)]
    q = DiskQueue(NAME, str(tmp_path))
    q.put_many(records)
    with open(data_file(tmp_path, 0), "r+b") as f:
        f.seek(4 + len(records[0]))
        f.write(struct.pack(">i", -1))
    assert q.read_many(10) == records[:1]
    assert q.depth() == 0
    assert (tmp_path / (data_file(tmp_path, 0).name + ".bad")).exists()
    q.put(message(5))
    assert data_file(tmp_path, 1).exists()
    assert q.read_many(10) == [message(5)]
    q.close()
    assert meta_file(tmp_path).read_text() == f"0\n1,{4 + len(message(5))}\n1,{4 + len(message(5))}\n"


def test_missing_read_file_is_skipped(tmp_path):
    records = [message(n, body_size=50) for n in range(6)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    q.put_many(records)
    q.close()
    data_file(tmp_path, 0).unlink()
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    assert read_all(q) == records[3:]
    assert q.depth() == 0
    q.close()


def reopened_after_a_kill(path: Path, meta: str, caplog) -> DiskQueue:
    """Write ``meta`` as the meta file a killed process left, then open the queue with its log captured."""
    meta_file(path).write_text(meta)
    caplog.clear()
    caplog.set_level(logging.INFO)
    return DiskQueue(NAME, str(path), max_bytes_per_file=250)


def problems(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_read_file_removed_before_the_meta_recorded_it_is_no_data_loss(tmp_path, caplog):
    """go-diskqueue removes a file it has read and then syncs: a kill in between leaves a meta file naming the
    missing file and counting its last records. nsqd 1.3.0 logs a read ERROR and "data loss" at the tail; nothing
    was lost, so the restart warns once and the tail check stays quiet."""
    records = [message(n, body_size=50) for n in range(9)]  # 3 per file
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    q.put_many(records)
    q.close()
    data_file(tmp_path, 0).unlink()
    q = reopened_after_a_kill(tmp_path, f"8\n0,{4 + len(records[0])}\n2,{3 * (4 + len(records[0]))}\n", caplog)
    assert read_all(q) == records[3:]
    assert q.depth() == 0
    q.close()
    assert problems(caplog, logging.ERROR) == []
    (warning,) = problems(caplog, logging.WARNING)[:1]
    assert "missing" in warning and "removed after being read" in warning
    assert "data loss" not in caplog.text
    assert meta_file(tmp_path).read_text() == f"0\n2,{3 * (4 + len(records[0]))}\n2,{3 * (4 + len(records[0]))}\n"


def test_a_read_position_past_the_end_of_its_file_is_no_data_loss(tmp_path, caplog):
    """A read file shorter than the meta's read position was being cut down by its removal when the process died
    (the removal of older versions of this queue): it had been read, it is removed, reading goes on."""
    records = [message(n, body_size=50) for n in range(9)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    q.put_many(records)
    q.close()
    size = 4 + len(records[0])
    os.truncate(data_file(tmp_path, 0), size)
    q = reopened_after_a_kill(tmp_path, f"7\n0,{2 * size}\n2,{3 * size}\n", caplog)
    assert read_all(q) == records[3:]
    q.close()
    assert problems(caplog, logging.ERROR) == []
    assert "removed after being read" in problems(caplog, logging.WARNING)[0]
    assert "data loss" not in caplog.text and not list(tmp_path.glob("*.bad"))
    assert not data_file(tmp_path, 0).exists()


def test_files_before_the_read_file_are_removed_at_start_up(tmp_path, caplog):
    """The meta file moves the reader past a file before the file is removed: a kill in between leaves the file
    behind. The restart removes it without reading it again."""
    records = [message(n, body_size=50) for n in range(9)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    q.put_many(records)
    q.close()
    size = 4 + len(records[0])
    q = reopened_after_a_kill(tmp_path, f"5\n1,{size}\n2,{3 * size}\n", caplog)
    assert read_all(q) == records[4:]
    q.close()
    assert problems(caplog, logging.ERROR) == problems(caplog, logging.WARNING) == []
    assert any("removing" in m and data_file(tmp_path, 0).name in m for m in problems(caplog, logging.INFO))
    assert queue_files(tmp_path) == [data_file(tmp_path, 2).name, meta_file(tmp_path).name]


# -- the exact format --------------------------------------------------------------------------
def test_meta_file_is_byte_exact(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), sync_every=1)
    sizes = [26, 126, 1026]
    for size in sizes:
        q.put(b"m" * size)
    assert meta_file(tmp_path).read_bytes() == b"3\n0,0\n0,%d\n" % (sum(sizes) + 12)
    q.read_many(1)  # a read's sync runs on the worker
    q.wait_idle()
    assert meta_file(tmp_path).read_bytes() == b"2\n0,30\n0,%d\n" % (sum(sizes) + 12)
    q.close()
    assert queue_files(tmp_path) == [data_file(tmp_path, 0).name, meta_file(tmp_path).name]


def test_empty_queue_leaves_a_meta_file_on_close(tmp_path):
    q = DiskQueue(NAME, str(tmp_path))
    q.close()
    assert meta_file(tmp_path).read_bytes() == b"0\n0,0\n0,0\n"
    assert queue_files(tmp_path) == [meta_file(tmp_path).name]
    q = DiskQueue(NAME, str(tmp_path))
    assert q.depth() == 0 and q.read_position() == (0, 0)
    q.put(message(0))
    assert len(q.read_many(1)) == 1
    q.close()
    size = 4 + len(message(0))
    assert meta_file(tmp_path).read_bytes() == b"0\n0,%d\n0,%d\n" % (size, size)
    reopened = DiskQueue(NAME, str(tmp_path))
    assert reopened.depth() == 0 and reopened.read_position() == (0, size)
    reopened.close()


def test_closing_an_unchanged_queue_leaves_its_meta_file_alone(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), sync_every=1)
    q.put(message(0))
    q.close()
    before = meta_file(tmp_path).stat()
    q = DiskQueue(NAME, str(tmp_path))
    q.close()  # nothing read or written: the meta file on disk says it already
    after = meta_file(tmp_path).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    q = DiskQueue(NAME, str(tmp_path))
    assert len(q.read_many(1)) == 1  # a read moves the position: the meta file is rewritten
    q.close()
    assert meta_file(tmp_path).stat().st_ino != before.st_ino
    assert DiskQueue(NAME, str(tmp_path)).depth() == 0


def test_files_are_private(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), sync_every=1)
    q.put(message(0))
    for p in (data_file(tmp_path, 0), meta_file(tmp_path)):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    q.close()


def test_reads_files_written_by_nsqd(tmp_path):
    """A data directory built from the format: topic "events", channel "events:archive", two files, the reader
    part-way into the first one."""
    name = "events:archive"
    records = [message(n, body_size=n * 3, attempts=n % 2) for n in range(7)]
    file0 = framed(records[:4])
    file1 = framed(records[4:])
    (tmp_path / f"{name}.diskqueue.000000.dat").write_bytes(file0)
    (tmp_path / f"{name}.diskqueue.000001.dat").write_bytes(file1)
    read_pos = 4 + len(records[0])
    (tmp_path / f"{name}.diskqueue.meta.dat").write_bytes(b"6\n0,%d\n1,%d\n" % (read_pos, len(file1)))

    q = DiskQueue(name, str(tmp_path))
    assert q.depth() == 6
    got = read_all(q)
    assert got == records[1:]
    assert struct.unpack(">qH16s", got[0][:26]) == (1_700_000_000_000_000_001, 1, b"18a398c44e669001")
    q.close()
    assert (tmp_path / f"{name}.diskqueue.meta.dat").read_bytes() == b"0\n1,%d\n1,%d\n" % (len(file1), len(file1))


def test_files_written_by_diskqueue_parse_independently(tmp_path):
    records = [message(n, body_size=n * 11 % 300) for n in range(40)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    q.put_many(records[:25])
    for record in records[25:]:
        q.put(record)
    assert q.read_many(6) == records[:6]
    q.close()
    assert independent_read(tmp_path) == records[6:]
    for num in range(4):
        blob = data_file(tmp_path, num).read_bytes() if data_file(tmp_path, num).exists() else None
        assert blob is None or len(blob) <= 1000


# -- sync policy -------------------------------------------------------------------------------
def test_sync_every_counts_reads_and_writes(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), sync_every=4)
    q.put(message(0))
    q.put(message(1))
    q.put(message(2))
    assert not meta_file(tmp_path).exists()
    q.read_many(1)  # the 4th operation
    q.wait_idle()
    record = 4 + len(message(0))
    assert meta_file(tmp_path).read_text() == f"2\n0,{record}\n0,{3 * record}\n"
    q.put_many([message(3), message(4), message(5)])
    assert meta_file(tmp_path).read_text() == f"2\n0,{record}\n0,{3 * record}\n"
    q.put(message(6))
    q.wait_idle()
    assert meta_file(tmp_path).read_text() == f"6\n0,{record}\n0,{7 * record}\n"
    q.close()


def test_a_queue_is_active_from_its_first_change_until_synced(tmp_path):
    active = {}
    q = DiskQueue(NAME, str(tmp_path), sync_timeout=2.0, active=active)
    assert active == {} and not q.owes_sync
    q.put(message(0))
    q.put(message(1))
    assert list(active) == [q] and q.owes_sync
    active.clear()  # what the owner does once the queue is clean; it comes back with the next change
    assert q.sync_if_due(100.0) is False and q.owes_sync
    assert q.sync_if_due(102.0) is True
    q.wait_idle()
    assert not q.owes_sync and active == {}
    q.put(message(2))
    assert list(active) == [q]
    q.close()
    assert not q.owes_sync


def test_sync_if_due(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), sync_timeout=2.0)
    assert q.sync_if_due(100.0) is False  # nothing happened
    q.put(message(0))
    assert q.sync_if_due(101.0) is False
    assert not meta_file(tmp_path).exists()
    assert q.sync_if_due(102.5) is False
    assert q.sync_if_due(103.0) is True
    q.wait_idle()
    assert meta_file(tmp_path).read_text().startswith("1\n")
    assert q.sync_if_due(200.0) is False  # nothing new since
    q.close()


def test_empty_and_delete(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    q.put_many([message(n, body_size=50) for n in range(7)])
    q.sync()
    q.empty()
    assert q.depth() == 0 and q.read_many(10) == []
    assert queue_files(tmp_path) == []
    q.put(message(8))
    assert queue_files(tmp_path) == [data_file(tmp_path, 3).name]  # numbering continues after file 2
    assert q.read_many(5) == [message(8)]
    q.close()
    assert meta_file(tmp_path).read_text() == f"0\n3,{4 + len(message(8))}\n3,{4 + len(message(8))}\n"

    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    q.put_many([message(n, body_size=50) for n in range(5)])
    q.delete()
    assert queue_files(tmp_path) == []
    with pytest.raises(DiskQueueClosed):
        q.read_many(1)


# -- disk errors -------------------------------------------------------------------------------
def test_disk_full_with_a_file_size_limit(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: writes past 1000 bytes fail with EFBIG, part-way through."""
    script = textwrap.dedent(f"""
        import errno, resource, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from nsqd.queues.diskqueue import DiskQueue
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        path = {str(tmp_path)!r}
        record = lambda n: b"%026d" % n + b"b" * 200          # 226 bytes, 230 on disk
        q = DiskQueue("{NAME}", path, sync_every=1)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        for n in range(4):
            q.put(record(n))                                  # 920 bytes
        try:
            q.put(record(4))                                  # would end at 1150: 80 bytes land, then EFBIG
        except OSError as exc:
            assert exc.errno == errno.EFBIG, exc
        else:
            raise AssertionError("the put did not fail")
        assert q.depth() == 4 and q.last_error is not None and q.last_error.errno == errno.EFBIG
        assert q.statistics().write_pos == 920
        assert open(q.file_name(0), "rb").read()[-226:-200] == b"%026d" % 3   # cut back: nothing half-written
        try:
            q.put_many([record(5), record(6)])
        except OSError:
            pass
        else:
            raise AssertionError("the batch did not fail")
        assert q.depth() == 4
        assert q.read_many(1) == [record(0)]                  # reads still work
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space is back
        q.put_many([record(7), record(8)])
        assert q.last_error is None
        q.close()
        q = DiskQueue("{NAME}", path)
        got = q.read_many(100)
        assert got == [record(n) for n in (1, 2, 3, 7, 8)], got
        q.close()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_failed_batch_across_a_roll_is_undone(tmp_path, monkeypatch, caplog):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=250)
    first = [message(n, body_size=50) for n in range(2)]
    q.put_many(first)
    real_pwrite = os.pwrite
    calls = []

    def failing_second_write(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", failing_second_write)
    with pytest.raises(OSError):
        q.put_many([message(n, body_size=50) for n in range(10, 15)])  # 1 fits in file 0, the rest in file 1
    assert len(calls) == 2
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert q.depth() == 2 and q.last_error is not None
    assert data_file(tmp_path, 0).stat().st_size == 160
    assert not data_file(tmp_path, 1).exists()
    q.put(message(20, body_size=50))
    assert q.last_error is None
    assert read_all(q) == first + [message(20, body_size=50)]
    q.close()
    assert independent_read(tmp_path) == []
