"""DiskQueue's file work off the caller's thread: rolls, removals and syncs on its worker, reads ahead on a thread.

A job that waits for a ``threading.Event`` holds the worker, so what runs in the background can be seen queued and
then finished, with no sleeps: the caller's operations return while the worker is held, and whatever must be on disk
when a call returns (``sync_every=1``, the group commit, ``close``) waits for it.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from nsqd.queues import file_worker, segment_reader
from nsqd.queues.diskqueue import DiskQueue
from nsqd.queues.group_commit import SyncBarrier
from nsqd.queues.segment_reader import SegmentReader, SplitRecords
from tests.nsqd.test_diskqueue import NAME, data_file, independent_read, message, meta_file, queue_files, read_all

REPO = Path(__file__).resolve().parents[2]
RECORD = 4 + len(message(0, body_size=70))  # 100 bytes on disk


class HeldWorker:
    """Holds the queue's worker until released: the jobs submitted meanwhile stay queued, in order."""

    def __init__(self, q: DiskQueue) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        q._submit(self._hold)
        assert self.started.wait(30)

    def _hold(self) -> None:
        self.started.set()
        self.release.wait()


def open_files(path: Path) -> set[str]:
    """Files under ``path`` this process has open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            found.add(os.path.basename(target))
    return found


def in_thread(fn) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


def test_rolls_and_removals_while_records_flow(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000, sync_every=7)  # 10 records per file
    sent, got = [], []
    for n in range(400):
        record = message(n, body_size=70)
        q.put(record)
        sent.append(record)
        if n % 3 == 0:
            got.extend(q.read_many(2))
    got.extend(read_all(q))
    assert got == sent
    q.wait_idle()
    assert queue_files(tmp_path) == [data_file(tmp_path, 39).name, meta_file(tmp_path).name]
    q.close()
    assert meta_file(tmp_path).read_text() == f"0\n39,{10 * RECORD}\n39,{10 * RECORD}\n"
    assert open_files(tmp_path) == set()


def test_a_read_does_not_wait_for_the_removal_of_the_file_it_finished(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    records = [message(n, body_size=70) for n in range(15)]
    q.put_many(records)  # file 0 full, file 1 half full
    held = HeldWorker(q)
    assert q.read_many(12) == records[:12]  # finishes file 0: its removal is queued behind the held job
    assert data_file(tmp_path, 0).exists()
    assert q.read_position() == (1, 2 * RECORD)
    held.release.set()
    q.wait_idle()
    assert not data_file(tmp_path, 0).exists()
    # written before the removal, when the reader reached file 1
    assert meta_file(tmp_path).read_text() == f"5\n1,0\n1,{5 * RECORD}\n"
    assert read_all(q) == records[12:]
    q.close()


def test_close_while_background_work_is_pending_persists_everything(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000, sync_every=5)
    records = [message(n, body_size=70) for n in range(35)]
    q.put_many(records[:20])
    q.wait_idle()
    synced = meta_file(tmp_path).read_text()
    held = HeldWorker(q)
    q.put_many(records[20:])  # two rolls: their syncs and the closing of the old files are queued
    assert q.read_many(13) == records[:13]  # finishes file 0: its removal is queued
    assert meta_file(tmp_path).read_text() == synced and data_file(tmp_path, 0).exists()  # none of it ran yet
    closer = in_thread(q.close)
    assert not held.release.is_set()  # close cannot have finished: it waits for the worker
    held.release.set()
    closer.join()
    assert q.closed
    assert not data_file(tmp_path, 0).exists()
    assert meta_file(tmp_path).read_text() == f"22\n1,{3 * RECORD}\n3,{5 * RECORD}\n"
    assert open_files(tmp_path) == set()
    assert independent_read(tmp_path) == records[13:]
    again = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    assert read_all(again) == records[13:]
    again.close()


def test_sync_every_1_waits_for_the_background_work_before_it(tmp_path):
    """A put with ``sync_every=1`` is on disk when it returns, the roll before it included."""
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000, sync_every=1)
    records = [message(n, body_size=70) for n in range(12)]
    q.put_many(records[:10])
    held = HeldWorker(q)
    putter = in_thread(lambda: q.put_many(records[10:]))  # rolls to file 1: the old file's fsync is queued
    assert not held.release.is_set()
    held.release.set()
    putter.join()
    assert meta_file(tmp_path).read_text() == f"12\n0,0\n1,{2 * RECORD}\n"
    q.close()


def test_group_commit_waits_for_the_background_work_before_it(tmp_path):
    barrier = SyncBarrier()
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000, sync_every=1, hold_reads=True, barrier=barrier)
    records = [message(n, body_size=70) for n in range(12)]
    q.put_many(records[:10], defer_sync=True)
    barrier.commit()
    held = HeldWorker(q)
    q.put_many(records[10:], defer_sync=True)  # rolls: the sync of file 0 and its closing are queued
    assert barrier
    committer = in_thread(barrier.commit)
    assert not held.release.is_set()
    held.release.set()
    committer.join()
    assert meta_file(tmp_path).read_text() == f"12\n0,0\n1,{2 * RECORD}\n"
    q.close()


def test_queued_syncs_are_coalesced(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), sync_every=2)
    q.put(message(0, body_size=70))
    held = HeldWorker(q)
    submitted = q._worker.submitted
    for n in range(1, 11):
        q.put(message(n, body_size=70))  # a sync falls due every second put
    assert q._worker.submitted == submitted + 1  # one sync job queued, replaced by each newer one
    held.release.set()
    q.wait_idle()
    assert meta_file(tmp_path).read_text() == f"10\n0,0\n0,{10 * RECORD}\n"
    q.close()


def test_empty_and_delete_wait_for_the_background_work(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000, sync_every=3)
    q.put_many([message(n, body_size=70) for n in range(25)])
    q.read_many(11)
    held = HeldWorker(q)
    q.put(message(99, body_size=70))  # a sync is queued behind the held job: it must not bring the meta back
    emptier = in_thread(q.empty)
    held.release.set()
    emptier.join()
    assert queue_files(tmp_path) == []
    q.put(message(100, body_size=70))
    q.delete()
    assert queue_files(tmp_path) == []
    assert open_files(tmp_path) == set()


def reading_from_disk(monkeypatch) -> None:
    """Every inline read counts as served by the disk: the rest of each file is read ahead on a thread."""
    monkeypatch.setattr(SegmentReader, "_served_by_disk", staticmethod(lambda started, switches: True))


def read_sizes(monkeypatch, chunk: int, ahead: int, from_disk: bool) -> None:
    """Inline reads of ``chunk`` bytes, reads ahead of ``ahead`` bytes, and with ``from_disk`` every file read
    ahead after its first read."""
    monkeypatch.setattr(segment_reader, "_READ_CHUNK", chunk)
    monkeypatch.setattr(segment_reader, "_READ_AHEAD", ahead)
    if from_disk:
        reading_from_disk(monkeypatch)


@pytest.mark.parametrize("from_disk", [False, True], ids=["page cache", "disk"])
@pytest.mark.parametrize(("chunk", "ahead"), [(8, 16), (64, 100), (100, 37), (30, 1000), (1 << 16, 1 << 20)])
def test_reads_ahead_of_any_size_give_back_every_record(tmp_path, monkeypatch, chunk, ahead, from_disk):
    """Records cut by the end of an inline read or of a read ahead, records larger than either."""
    read_sizes(monkeypatch, chunk, ahead, from_disk)
    rnd = random.Random(chunk * 7 + ahead)
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=3000, min_msg_size=1)
    sent, got = [], []
    for n in range(300):
        if rnd.random() < 0.5:
            batch = [bytes([65 + n % 26]) * rnd.randint(1, 400) + b"%d" % n for _ in range(rnd.randint(1, 10))]
            q.put_many(batch)
            sent.extend(batch)
        else:
            got.extend(q.read_many(rnd.randint(1, 20)))
    got.extend(read_all(q))
    assert got == sent
    q.close()
    assert open_files(tmp_path) == set()


def test_a_file_cut_short_under_a_read_ahead_is_still_corruption(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(segment_reader, "_READ_CHUNK", 150)
    monkeypatch.setattr(segment_reader, "_READ_AHEAD", 300)
    reading_from_disk(monkeypatch)
    records = [message(n, body_size=70) for n in range(15)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    q.put_many(records)
    q.close()
    os.truncate(data_file(tmp_path, 0), 5 * RECORD + 50)  # file 0 loses half of its 6th record and all after
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    assert read_all(q) == records[:5] + records[10:]
    assert "short read" in caplog.text
    q.close()


def test_the_read_file_is_closed_only_after_its_read_ahead(tmp_path, monkeypatch):
    """Finishing, skipping or closing a file while a read ahead of it may still run: no descriptor is left open,
    and every record comes back in order across files and restarts."""
    monkeypatch.setattr(segment_reader, "_READ_CHUNK", 64)
    monkeypatch.setattr(segment_reader, "_READ_AHEAD", 128)
    reading_from_disk(monkeypatch)
    records = [message(n, body_size=70) for n in range(60)]
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    q.put_many(records)
    assert q.read_many(3) == records[:3]  # a read ahead is running or done
    q.close()
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    got = []
    while len(got) < 57:
        got.extend(q.read_many(4))  # every file's end is crossed with a read ahead in flight
    assert got == records[3:]
    q.close()
    assert open_files(tmp_path) == set()


def test_kill_9_before_the_meta_of_a_roll_is_written_loses_nothing(tmp_path):
    """The worker is held, so the meta file still names file 0 while records go to files 1 and 2; the process
    dies; the restart finds the files after the meta's write file and keeps their records."""
    script = textwrap.dedent(f"""
        import sys, threading
        sys.path.insert(0, {str(REPO)!r})
        from nsqd.queues.diskqueue import DiskQueue
        from tests.nsqd.test_diskqueue import message
        q = DiskQueue({NAME!r}, {str(tmp_path)!r}, max_bytes_per_file=1000, sync_every=1)
        q.put_many([message(n, body_size=70) for n in range(5)])  # synced: "5\\n0,0\\n0,500\\n"
        started = threading.Event()
        q._submit(lambda: (started.set(), threading.Event().wait()))
        started.wait()
        q.sync_every = 1000
        q.put_many([message(n, body_size=70) for n in range(5, 25)])  # rolls twice; no meta can be written
        print("ready", flush=True)
        threading.Event().wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert meta_file(tmp_path).read_text() == f"5\n0,0\n0,{5 * RECORD}\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=1000)
    assert q.depth() == 25
    assert read_all(q) == [message(n, body_size=70) for n in range(25)]
    q.put(message(99, body_size=70))
    assert q.write_position() == (3, RECORD)  # after the files the roll began
    q.close()


def test_a_removed_segment_loses_its_name_then_is_cut_down_in_steps(tmp_path, monkeypatch):
    """The name goes before the first cut: a kill part-way leaves no file cut short for a restart to read."""
    monkeypatch.setattr(file_worker, "REMOVE_STEP", 1000)
    monkeypatch.setattr(file_worker, "REMOVE_PAUSE", 0.0)
    sizes = []
    real_ftruncate = os.ftruncate

    def ftruncate(fd, size):  # the real call, with the sizes it is asked for noted
        assert not path.exists()
        sizes.append(size)
        real_ftruncate(fd, size)

    monkeypatch.setattr(file_worker.os, "ftruncate", ftruncate)
    path = tmp_path / "segment.dat"
    path.write_bytes(b"x" * 4500)
    file_worker.remove_in_steps(str(path))
    assert sizes == [3500, 2500, 1500, 500]
    assert not path.exists()
    with pytest.raises(FileNotFoundError):
        file_worker.remove_in_steps(str(path))  # as os.remove: the queue's caller ignores it


def joined(split: SplitRecords) -> list[bytes]:
    """Split records put back together: header fields, then the body."""
    pack = SplitRecords.HEADER.pack
    return [
        pack(*fields) + body
        for *fields, body in zip(split.timestamps, split.attempts, split.ids, split.bodies, strict=True)
    ]


@pytest.mark.parametrize("from_disk", [False, True], ids=["page cache", "disk"])
@pytest.mark.parametrize(("chunk", "ahead"), [(8, 16), (64, 100), (100, 37), (1 << 16, 1 << 20)])
def test_split_reads_give_back_every_record_field_by_field(tmp_path, monkeypatch, chunk, ahead, from_disk):
    """``read_split`` cuts each record at the message header while parsing, across cut reads and files; mixed
    with ``read_many`` on the same queue, both see the records in order."""
    read_sizes(monkeypatch, chunk, ahead, from_disk)
    rnd = random.Random(chunk * 11 + ahead)
    q = DiskQueue(NAME, str(tmp_path), max_bytes_per_file=3000, min_msg_size=26)
    sent, got = [], []
    for n in range(300):
        step = rnd.random()
        if step < 0.5:
            batch = [
                SplitRecords.HEADER.pack(rnd.getrandbits(63), rnd.getrandbits(16), rnd.randbytes(16))
                + bytes([65 + n % 26]) * rnd.randint(0, 400)
                for _ in range(rnd.randint(1, 10))
            ]
            q.put_many(batch)
            sent.extend(batch)
        elif step < 0.8:
            split = q.read_split(rnd.randint(1, 20))
            assert len(split) == len(split.ids) == len(split.timestamps) == len(split.attempts)
            got.extend(joined(split))
        else:
            got.extend(q.read_many(rnd.randint(1, 20)))
    while split := q.read_split(7):
        got.extend(joined(split))
    assert got == sent
    assert q.depth() == 0 and not q.has_unread()
    q.close()
    assert open_files(tmp_path) == set()


def test_split_reads_need_records_of_at_least_a_header(tmp_path):
    q = DiskQueue(NAME, str(tmp_path), min_msg_size=1)
    q.put(b"x")
    with pytest.raises(ValueError, match="shorter than a message header"):
        q.read_split(1)
    assert q.read_many(1) == [b"x"]
    q.close()


# -- a kill between any two jobs of the worker -------------------------------------------------------------------
def crash_states(q: DiskQueue, path: Path, operate) -> list[Path]:
    """The directory as a kill -9 would leave it before the worker's first job and after each of them (the page
    cache survives such a kill, so a copy of the files is that state): the worker is held while ``operate(q)``
    queues its jobs, each job is wrapped to copy the directory once it has run, then the worker goes on."""
    held = HeldWorker(q)
    operate(q)
    states: list[Path] = []

    def snapshot() -> None:
        copy = path.parent / f"{path.name}-crash{len(states)}"
        copy.mkdir()
        for f in path.iterdir():
            if f.name.endswith(".dat"):
                (copy / f.name).write_bytes(f.read_bytes())
        states.append(copy)

    def after(job):
        def run():
            try:
                job()
            finally:
                snapshot()

        return run

    snapshot()
    with q._worker._lock:
        for entry in q._worker._jobs:
            entry[0] = after(entry[0])
    held.release.set()
    q.wait_idle()
    return states


@pytest.mark.parametrize("hold", [False, True], ids=["default", "held"])
def test_a_kill_while_read_files_are_removed_restarts_cleanly(tmp_path, caplog, hold):
    """Three files are read through (two of them to their end) and removed by the worker; a kill between any two of
    its jobs leaves a directory that opens with no error or warning, keeps no file before its read file, and reads
    exactly the records after the read position its meta file recorded."""
    records = [message(n, body_size=70) for n in range(25)]  # 10 per file: files 0, 1, 2
    path = tmp_path / "q"
    path.mkdir()
    q = DiskQueue(NAME, str(path), max_bytes_per_file=1000, sync_every=10**6, sync_timeout=3600, hold_reads=hold)
    q.put_many(records)
    q.close()
    q = DiskQueue(NAME, str(path), max_bytes_per_file=1000, sync_every=10**6, sync_timeout=3600, hold_reads=hold)

    def read_through(q: DiskQueue) -> None:
        if hold:
            token, got = q.read_many_held(23)
            q.ack_range(token, 23)
        else:
            got = q.read_many(23)
        assert got == records[:23]

    states = crash_states(q, path, read_through)
    q.close()
    assert len(states) >= 3
    for state in states:
        expected = independent_read(state)
        assert expected == records[-len(expected) :] and len(expected) >= 2, state.name
        caplog.clear()
        caplog.set_level(logging.INFO)
        restarted = DiskQueue(NAME, str(state), max_bytes_per_file=1000)
        assert read_all(restarted) == expected, state.name
        assert restarted.depth() == 0
        restarted.close()
        problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert problems == [], f"{state.name}: {problems}"
        read_num = int(meta_file(state).read_text().split("\n")[1].split(",")[0])
        assert [f for f in queue_files(state) if f < data_file(state, read_num).name] == [], state.name
