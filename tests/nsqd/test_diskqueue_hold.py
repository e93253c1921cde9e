"""DiskQueue in hold mode (durable mode): the committed read position stays at the oldest unacknowledged record."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from nsqd.queues.diskqueue import DiskQueue
from tests.nsqd.test_diskqueue import data_file, independent_read, message, meta_file, read_all

REPO = Path(__file__).resolve().parents[2]
NAME = "orders:archive"
RECORD = 4 + len(message(0))  # bytes one record takes on disk


def held_queue(path: Path, **kwargs) -> DiskQueue:
    return DiskQueue(NAME, str(path), hold_reads=True, **kwargs)


def test_meta_records_the_oldest_unacknowledged_record(tmp_path):
    q = held_queue(tmp_path)
    records = [message(n) for n in range(10)]
    q.put_many(records)
    token, got = q.read_many_held(4)
    assert got == records[:4] and token == 0
    assert q.depth() == 6 and q.statistics().held == 4
    q.ack(1)
    q.ack(2)
    q.sync()
    # records 1 and 2 are done, but 0 is not: a restart must begin at 0
    assert meta_file(tmp_path, NAME).read_text() == f"10\n0,0\n0,{10 * RECORD}\n"
    q.ack(0)
    q.sync()
    assert meta_file(tmp_path, NAME).read_text() == f"7\n0,{3 * RECORD}\n0,{10 * RECORD}\n"
    assert q.read_many_held(2) == (4, records[4:6])
    q.ack(3)
    q.ack(3)  # repeated: ignored
    q.ack(99)  # never handed out: ignored
    q.sync()
    assert meta_file(tmp_path, NAME).read_text() == f"6\n0,{4 * RECORD}\n0,{10 * RECORD}\n"
    q.close()


def test_reads_do_not_count_as_sync_operations(tmp_path):
    q = held_queue(tmp_path, sync_every=1)
    q.put_many([message(n) for n in range(3)])
    before = meta_file(tmp_path, NAME).read_text()
    q.read_many_held(3)
    assert meta_file(tmp_path, NAME).read_text() == before
    q.close()


def test_restart_without_close_reads_again_from_the_oldest_unacknowledged(tmp_path):
    records = [message(n, body_size=60) for n in range(12)]
    q = held_queue(tmp_path, max_bytes_per_file=300, sync_every=1)  # 90 bytes per record: 3 per file
    q.put_many(records)
    token, got = q.read_many_held(8)
    assert got == records[:8]
    for t in (0, 1, 2, 3, 5, 6, 7):  # record 4 is still in flight
        q.ack(token + t)
    q.put(message(50, body_size=60))  # a write syncs the meta (with the committed position)
    # no close: the process "died" here
    again = held_queue(tmp_path, max_bytes_per_file=300)
    assert again.depth() == 9
    assert read_all(again) == records[4:] + [message(50, body_size=60)]
    again.close()


def test_data_files_go_only_when_the_committed_position_passes_them(tmp_path):
    records = [message(n, body_size=60) for n in range(9)]
    q = held_queue(tmp_path, max_bytes_per_file=300)
    q.put_many(records)
    token, got = q.read_many_held(7)
    assert got == records[:7]
    for t in range(1, 7):
        q.ack(token + t)
    assert data_file(tmp_path, 0, NAME).exists() and data_file(tmp_path, 1, NAME).exists()
    q.ack(token)  # the committed position jumps to record 7, in file 2
    q.wait_idle()  # files are removed on the worker
    assert not data_file(tmp_path, 0, NAME).exists() and not data_file(tmp_path, 1, NAME).exists()
    assert data_file(tmp_path, 2, NAME).exists()
    q.close()
    assert independent_read(tmp_path, NAME) == records[7:]


def test_a_corrupt_file_keeps_its_name_while_records_read_from_it_are_held(tmp_path):
    records = [message(n, body_size=60) for n in range(6)]
    q = held_queue(tmp_path, max_bytes_per_file=300)  # 90 bytes per record: 3 per file
    q.put_many(records)
    q.close()
    with open(data_file(tmp_path, 0, NAME), "ab") as f:
        f.write(struct.pack(">i", 86) + b"cut short")  # a write cut by SIGKILL: the kernel stops at a page
    q = held_queue(tmp_path, max_bytes_per_file=300)
    token, got = q.read_many_held(10)
    assert got == records  # the whole records before the damage, then the next file
    q.ack_range(token + 3, 3)  # those of file 0 are still in flight
    q.sync()
    q.wait_idle()
    assert data_file(tmp_path, 0, NAME).exists()
    # no close: the process "died" here; a restart delivers the unacknowledged records again
    again = held_queue(tmp_path, max_bytes_per_file=300)
    token, got = again.read_many_held(10)
    assert got == records
    again.ack_range(token, 6)
    again.wait_idle()
    assert not data_file(tmp_path, 0, NAME).exists()
    assert (tmp_path / (data_file(tmp_path, 0, NAME).name + ".bad")).exists()
    again.close()


def test_empty_makes_outstanding_tokens_stale(tmp_path):
    q = held_queue(tmp_path, max_bytes_per_file=300)
    q.put_many([message(n, body_size=60) for n in range(5)])
    token, _ = q.read_many_held(5)
    q.empty()
    assert [p.name for p in tmp_path.iterdir()] == []
    q.put(message(9, body_size=60))
    q.ack(token)  # from before the empty: must not release the new record
    new_token, got = q.read_many_held(5)
    assert got == [message(9, body_size=60)] and new_token == token + 5
    q.sync()
    assert meta_file(tmp_path, NAME).read_text().startswith("1\n")
    q.ack(new_token)
    q.close()
    assert meta_file(tmp_path, NAME).read_text().startswith("0\n")


def test_close_keeps_what_is_still_held(tmp_path):
    q = held_queue(tmp_path)
    records = [message(n) for n in range(4)]
    q.put_many(records)
    token, _ = q.read_many_held(4)
    q.ack(token)
    q.close()
    q.ack(token + 1)  # after close: ignored, the meta file stays as close wrote it
    assert independent_read(tmp_path, NAME) == records[1:]


def test_kill_9_loses_no_unacknowledged_record(tmp_path):
    """A process writes records and acknowledges each one it has 'finished' (every other record); SIGKILL at any
    point must leave every unfinished record in the queue."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from nsqd.queues.diskqueue import DiskQueue
        q = DiskQueue("{NAME}", {str(tmp_path)!r}, sync_every=1, max_bytes_per_file=2000, hold_reads=True)
        n = 0
        while True:
            q.put(b"%026d" % n + b"b" * 100)
            token, got = q.read_many_held(1)
            for record in got:
                if int(record[:26]) % 2 == 0:
                    q.ack(token)
            print(n, flush=True)
            n += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        acked = [int(proc.stdout.readline()) for _ in range(80)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert acked == list(range(80))
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=2000)
    got = {int(r[:26]) for r in read_all(q)}
    q.close()
    unfinished = {n for n in range(80) if n % 2}
    assert unfinished <= got


# -- group commit ------------------------------------------------------------------------------------------------
def test_a_deferred_sync_waits_for_the_barrier_commit(tmp_path):
    from nsqd.queues.group_commit import SyncBarrier

    barrier = SyncBarrier()
    a = DiskQueue("a", str(tmp_path), sync_every=1, barrier=barrier)
    b = DiskQueue("b", str(tmp_path), sync_every=1, barrier=barrier)
    a.put_many([message(0)], defer_sync=True)
    a.put_many([message(1)], defer_sync=True)
    b.put_many([message(2)], defer_sync=True)
    assert barrier and not meta_file(tmp_path, "a").exists() and not meta_file(tmp_path, "b").exists()
    barrier.commit()  # one sync per queue for the three puts
    assert not barrier
    assert meta_file(tmp_path, "a").read_text() == f"2\n0,0\n0,{2 * RECORD}\n"
    assert meta_file(tmp_path, "b").read_text() == f"1\n0,0\n0,{RECORD}\n"
    b.put_many([message(3)])  # without defer_sync: synced at once, as before
    assert meta_file(tmp_path, "b").read_text() == f"2\n0,0\n0,{2 * RECORD}\n" and not barrier
    a.put_many([message(4)], defer_sync=True)
    a.delete()
    barrier.commit()  # a deleted queue is skipped: its files do not come back
    assert not meta_file(tmp_path, "a").exists() and not data_file(tmp_path, 0, "a").exists()
    b.close()


def test_split_reads_hold_each_record_at_its_own_position(tmp_path):
    """Tokens of ``read_split_held`` map to the records' real offsets (header + body of each, sizes differing),
    mixed with ``read_many_held``: the committed position lands exactly after the acknowledged ones."""
    records = [message(n, body_size=10 + 37 * n) for n in range(8)]
    ends = []
    for record in records:
        ends.append((ends[-1] if ends else 0) + 4 + len(record))
    q = held_queue(tmp_path)
    q.put_many(records)
    token, split = q.read_split_held(3)
    assert token == 0 and split.bodies == [r[26:] for r in records[:3]] and split.ids == [r[10:26] for r in records[:3]]
    assert q.read_many_held(2) == (3, records[3:5])
    token, split = q.read_split_held(10)
    assert token == 5 and split.bodies == [r[26:] for r in records[5:]]
    assert q.statistics().held == 8
    for acked in range(8):
        q.ack(acked)
        q.sync()
        assert meta_file(tmp_path, NAME).read_text().split("\n")[1] == f"0,{ends[acked]}"
    q.close()


def test_put_many_held_takes_what_it_writes_as_read_when_the_reader_was_at_the_writer(tmp_path):
    records = [message(n, body_size=60) for n in range(8)]
    q = held_queue(tmp_path, max_bytes_per_file=300)  # 90 bytes per record: 3 per file
    assert q.put_many_held(records[:2]) == 0  # held at once, nothing left to read
    assert q.depth() == 0 and q.statistics().held == 2 and q.read_many_held(5) == (2, [])
    assert q.put_many_held(records[2:4]) is None  # the second went into a new file: left for the reader
    assert q.read_many_held(5) == (2, records[2:4])
    q.put_many(records[4:5])
    assert q.put_many_held(records[5:6]) is None  # the reader was behind: appended
    assert q.read_many_held(5) == (4, records[4:6])
    assert q.put_many_held(records[6:7]) is None  # a new file again
    assert q.read_many_held(5) == (6, records[6:7])
    assert q.put_many_held(records[7:]) == 7
    assert q.depth() == 0 and q.read_many_held(5) == (8, [])
    for token in (0, 1, 2, 4, 5, 6):
        q.ack(token)
    q.sync()
    # the committed position is the oldest unacknowledged record (3): a restart reads from there
    q2 = held_queue(tmp_path, max_bytes_per_file=300)
    assert q2.read_many_held(10)[1] == records[3:]
    q2.close()
    q.close()


def test_records_put_many_held_takes_as_read_are_not_counted_lost_when_their_file_ends(tmp_path):
    """The reader opened a file with its side file of checksums, caught up, and later records were taken as read
    at once: passing the file's end must not count them as records the file lost (a replica's store did, and
    asked its origin for a new backfill at every file under steady load)."""
    damaged: list[int] = []
    records = [message(n, body_size=60) for n in range(8)]
    q = held_queue(tmp_path, max_bytes_per_file=400, checksums=True, on_damage=lambda _q, count: damaged.append(count))
    q.put_many(records[:1])
    assert q.read_many_held(5) == (0, records[:1])  # the reader has the first file open, checked
    assert q.put_many_held(records[1:2]) == 1  # taken as read at once
    assert q.put_many_held(records[2:4]) == 2
    assert q.put_many_held(records[4:6]) is None  # the file is full: a new one, left for the reader
    assert q.read_many_held(5) == (4, records[4:6])  # passing the first file's end
    assert damaged == [] and q.statistics().damaged == 0
    q.close()
