"""The disk queue: a FIFO of opaque records in segment files that real nsqd reads and writes too.

Files, for a queue called ``name`` in ``data_path`` (a topic ``T`` or a channel ``T:C``)::

    <name>.diskqueue.000000.dat     segment files, numbered from 0, six digits
    <name>.diskqueue.000001.dat     each holds records back to back:
    ...                                 [int32 big-endian length][length bytes]
    <name>.diskqueue.meta.dat       "<depth>\\n<readFileNum>,<readPos>\\n<writeFileNum>,<writePos>\\n"

The records are encoded messages (26-byte header + body). The queue checks only that a length lies in
``[min_msg_size, max_msg_size]``, on the way in and on the way out; ``read_many`` hands records back whole, and
``read_split`` cuts each one at the header while parsing it (the broker's read path: see ``SplitRecords``). Every
file is created 0600.

Positions. The writer appends at ``(write_file_num, write_pos)`` and the reader consumes from
``(read_file_num, read_pos)``; there is something to read while the reader is behind the writer. ``depth`` counts
unread records. In the current write file the reader stops at ``write_pos``; in an older, complete file it reads to
the file's end: the size the writer left it at when it moved on, or the size on disk when the file is opened later.
A file whose last record has been read is deleted at once (by the worker, see below).

Rolling. Before a record is written, if ``write_pos > 0`` and the record (with its 4-byte length) would take the
file past ``max_bytes_per_file``, writing moves to the next file number. A file therefore exceeds the limit only
when its single record does.

Writes are positioned (``pwrite`` at ``write_pos``) from one buffer per call: ``put_many`` joins the whole batch
into one write per segment it touches. Nothing is buffered in the process, so a record is visible to the reader,
and survives the process being killed, as soon as the call returns. If the disk fails part-way, the queue goes back
to where it was before the call: the file is cut back to the old ``write_pos``, files begun by the call are removed,
the counters are restored, the error is kept in ``last_error`` (until a later put or sync succeeds) and it
propagates. A batch is thus all or nothing, and a half-written record is never counted. Bytes that could not be
cut back are harmless: the next write goes over them, and the reader never reads past ``write_pos``.

Syncing means fsync of the write file, then rewriting the meta file atomically (``<meta>.<random>.tmp``, fsync,
rename), with the positions and depth of the moment the sync was asked for. It happens:

- after ``sync_every`` operations, reads and writes both counting (checked once per call, so a batch is synced
  once, after all of it); ``sync_every=1`` makes every put durable before it returns;
- on every roll (asked for before the new file gets data), when the reader moves to a new file, after recovering
  from corruption, and on ``close()``;
- from ``sync_if_due(now)``, which the owner calls periodically: a sync once something has been pending for
  ``sync_timeout`` seconds on the owner's clock.

The worker. The broker calls the queue from its event loop, and some file work takes milliseconds: removing a read
segment (the kernel frees its blocks in ``unlink``: 4-6 ms for 100 MB), the fsyncs of a sync, the directory fsync
after a new file. That work goes to the queue's ``FileWorker`` (``file_worker.py``), which runs it on a thread, one
job at a time, in the order it was asked for; the call that asked returns at once. The order keeps the files
consistent: the meta file only moves forward, the finished write file is fsynced before its descriptor is closed
and before any later meta file is written, a directory fsync comes before the meta naming the new file, a segment
is removed before the meta that no longer names it. A sync asked for while an earlier one is still queued replaces
it (a slow disk does not pile up syncs). What must be on disk when a call returns is synced inline, after waiting
for the worker: a put with ``sync_every=1``, ``sync()`` (the group commit below), ``close()``; ``empty()`` and
``delete()`` wait for it too. A process that dies leaves at most what the worker had not done yet, which a restart
handles: a meta file older than the data (records beyond its write position are salvaged, in the write file and in
files after it that a roll began), a segment already read but not yet removed. A read segment is removed only
after the meta file that moves the reader past it (a sync job submitted before the removal), and the removal takes
the file's name first (``remove_in_steps``), so a restart finds the file whole behind the meta's read file (it is
removed then) or gone, never a meta naming a missing or cut file. A background sync that fails is logged and kept
in ``last_error``; ``sync_if_due`` tries again after ``sync_timeout``.

Reading. The records of the read file are parsed by a ``SegmentReader`` (``segment_reader.py``): inline while the
page cache serves the file, and once a read had to wait for the disk, from reads ahead on a thread.

Recovery when opening an existing queue:

- A write file longer than the meta's ``write_pos`` holds records written after the last sync (the process died in
  between). Writing continues in a new file so they are not overwritten, the reader still reads them, and the valid
  records found there are added to ``depth``.
- A write file shorter than the meta's ``write_pos`` (or missing) is treated as complete; writing moves on too.
- Data files after the meta's write file (a roll whose meta file the worker had not written yet) are complete files
  of the queue: their valid records are added to ``depth`` and writing moves on after the last of them.
- A record with a length out of range, or cut short, means the rest of its file cannot be trusted: the file is
  renamed ``<file>.bad`` (logged) and reading goes on with the next file; when it was the write file, writing moves
  to a new file as well.
- Data files before the meta's read file were read before the stop and not yet removed: they are removed (info).
- A complete read file that is missing or shorter than the meta's read position was removed after being read, before
  a meta file recorded it (go-diskqueue removes before it syncs, and so did this queue when that sync failed): a
  warning, and reading goes on with the next file. The records the meta still counts for it are no data loss.
- When the reader reaches the writer and ``depth`` is not 0, records were lost (or counted twice); ``depth`` is
  reset to 0 and that is logged (an error, or a warning when the difference is the removed read file's). A reader
  found beyond the writer skips both to a fresh file.

Beyond go-diskqueue: a reader that has caught up with the writer at the moment the writer rolls moves cleanly to
the next file instead of taking the finished file for corrupt; the tail check also runs after a corrupt file is
skipped, so ``depth`` cannot stay wrong when that file was the last one; records salvaged from a write file longer
than its meta are counted in ``depth`` instead of making it negative.

Held reads (``hold_reads=True``, the broker's durable mode). Normally the meta file's read position is where the
reader is, so a record taken by ``read_many`` is gone from the queue once the next sync runs, whatever its owner does
with it. In hold mode the reader moves on in memory, but the *committed* read position (the one the meta file records,
and the one a restart resumes from) stays at the oldest record that has not been acknowledged. ``read_many_held``
returns the token of its first record (tokens number the records read, one by one); ``ack(token)`` says that the
record is no longer needed (the consumer finished it, or a newer copy of it was appended to the queue). The committed
position then moves over every leading acknowledged record; data files behind it are deleted only then. A restart after
a crash therefore reads again every record from the oldest unacknowledged one on: nothing unacknowledged is lost, and
records acknowledged after that point come back as duplicates. An acknowledgement is not synced by itself (a stale
committed position can only cause redelivery); it reaches the meta file with the next sync. A corrupt file is renamed
``.bad`` only once the committed position has passed it: a restart before then reads its valid records again.
Reads do not count as sync operations in this mode, since they change nothing that a restart would use.

Group commit (``defer_sync=True`` on ``put_many``, with a ``SyncBarrier``). A sync that a put makes due can be
put off: the queue joins the barrier (``group_commit.py``) instead, and whoever is about to acknowledge the put
(the connection's writer, before it sends the ``OK``) calls ``barrier.commit()``, which syncs every queue that
joined (inline, after the worker's earlier jobs, the fsync of a file finished by a roll among them). Puts from many
connections handled in one turn of the event loop then share one fsync, and still no ``OK`` leaves before its
message is on disk. A queue closed or deleted before the commit is skipped (it synced, or its files are gone).

Many queues. A node may hold tens of thousands of topics and channels, most never spilling to disk, so a queue
costs little until it is used: its ``FileWorker`` is made with its first job, and with ``known_files`` (the names
of the files its directory held when the owner started; the owner holds the directory's lock, so nothing else adds
any) a queue whose meta file was not there starts empty without opening anything. No file is created before the
first record is written; ``close()`` still leaves the meta file, as nsqd does.

The API is synchronous: the broker calls ``put``, ``put_many`` and ``read_many`` from its event loop. What they
do inline is plain system calls on page-cache files (``pwrite``, ``pread`` when no read ahead has the bytes yet,
``open``); everything slow goes to the worker, except the syncs that must be done before the call returns.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
from collections import deque
from collections.abc import Container
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from .atomic_file import replace_file
from .checksums import LostRecords, SideFile, entries_of, side_file_name
from .file_worker import FileWorker, remove_in_steps
from .group_commit import SyncBarrier
from .segment_reader import Damaged, SegmentReader, SplitRecords

_Records = TypeVar("_Records", list[bytes], SplitRecords)

__all__ = ["DiskQueue", "DiskQueueClosed", "DiskQueueStatistics"]

_LENGTH = struct.Struct(">i")
#: segment files are read without access-time updates where the system allows it (Linux, files nsqd owns): the
#: first read of a file written moments before would otherwise dirty its inode, a journal update from the loop
_READ_FLAGS_PLAIN = os.O_RDONLY | os.O_CLOEXEC  # where O_NOATIME is refused: a file of another user
_READ_FLAGS = _READ_FLAGS_PLAIN | getattr(os, "O_NOATIME", 0)
# A held record's start is kept as one int: file number above _POS_BITS, byte position below.
_POS_BITS = 40
_POS_MASK = (1 << _POS_BITS) - 1

_default_log = logging.getLogger("nsqd")

#: Tests only: while the file this names exists, the inline sync's fsync (the group commit's, and
#: ``--sync-every=1``'s: the one that must succeed before an OK) fails with EIO, as a failing disk's would. Set in the
#: environment of an nsqd under test; a real failing device (device-mapper's error target) needs privileges and
#: kernel modules a test machine may lack.
FAIL_FSYNC_ENV = "NSQD_TEST_FAIL_FSYNC"


def _fsync_hook():
    trigger = os.environ.get(FAIL_FSYNC_ENV)
    if not trigger:
        return os.fsync

    def fsync(fd: int) -> None:
        if os.path.exists(trigger):
            raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (injected: {FAIL_FSYNC_ENV})")
        os.fsync(fd)

    return fsync


_fsync = _fsync_hook()


class DiskQueueClosed(Exception):
    """The queue was closed or deleted."""


@dataclass(frozen=True)
class DiskQueueStatistics:
    depth: int
    read_file_num: int
    read_pos: int
    write_file_num: int
    write_pos: int
    last_error: str | None
    held: int = 0  # records read but not yet released by the committed position (hold mode)
    damaged: int = 0  # records found damaged or lost (never delivered) since the queue was opened


#: what the hold mode's sets are without hold mode
_NO_NUMBERS: frozenset[int] = frozenset()

#: the meta text of a queue that has never held a record: what a missing meta file means at start-up
_EMPTY_META = b"0\n0,0\n0,0\n"


class DiskQueue:
    """A disk-backed FIFO of records, in go-diskqueue's file format. See the module notes."""

    # slots: more attributes than CPython keeps without a dictionary of their own, one more object per queue
    __slots__ = (
        "name",
        "data_path",
        "max_bytes_per_file",
        "min_msg_size",
        "max_msg_size",
        "sync_every",
        "sync_timeout",
        "hold_reads",
        "barrier",
        "failing",
        "active",
        "log",
        "known_files",
        "last_error",
        "_depth",
        "_read_file_num",
        "_read_pos",
        "_write_file_num",
        "_write_pos",
        "_write_fd",
        "_reader",
        "_read_end",
        "_worker",
        "_sync_failed",
        "_ops",
        "_dirty",
        "_need_sync",
        "_pending_since",
        "_closed",
        "_held",
        "_held_base",
        "_acked",
        "_oldest_file",
        "_bad_files",
        "_removed_read_file",
        "_meta_path",
        "_saved_meta",
        "checksums",
        "on_damage",
        "damaged",
        "lost",
        "damage_at",
        "_sum_fd",
        "_write_count",
        "_synced_at",
        "_suspect",
    )

    def __init__(
        self,
        name: str,
        data_path: str,
        *,
        max_bytes_per_file: int = 104857600,
        min_msg_size: int = 26,
        max_msg_size: int = 1048576 + 26,
        sync_every: int = 2500,
        sync_timeout: float = 2.0,
        hold_reads: bool = False,
        barrier: SyncBarrier | None = None,
        failing: dict | None = None,
        active: dict | None = None,
        logger: logging.Logger | None = None,
        known_files: Container[str] | None = None,
        checksums: bool = False,
        on_damage=None,
    ) -> None:
        assert 0 < max_bytes_per_file <= _POS_MASK and 0 <= min_msg_size <= max_msg_size and sync_every >= 1
        self.name = name
        self.data_path = data_path
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = sync_every
        self.sync_timeout = sync_timeout
        self.hold_reads = hold_reads
        self.barrier = barrier
        # queues that have had an error, shared by the daemon's queues: health is read from these alone, not from
        # every queue (the reader drops those that have recovered or closed)
        self.failing = failing
        # queues with changes not yet synced, shared likewise: the owner's periodic sync_if_due visits these alone
        # (an idle queue costs nothing per tick); a queue enters when it becomes dirty, the owner drops it when clean
        self.active = active
        self.log = logger if logger is not None else _default_log
        self.known_files = known_files  # see "Many queues" in the module notes
        self.last_error: OSError | None = None
        # Checksums (``checksums.py``): a side file per segment, written with the records and checked on reading.
        # Records found damaged or lost are counted in ``damaged`` and reported to ``on_damage(queue, count)``.
        self.checksums = checksums
        self.on_damage = on_damage
        self.damaged = 0
        #: the side file entries of the records found damaged or lost since ``take_lost`` (``LostRecords``):
        #: what a copy got back from elsewhere must match; None until the first (an idle queue holds no more objects)
        self.lost: LostRecords | None = None
        #: where the last damage was found, ``(file number, byte)``, when ``on_damage`` is called: records lost past
        #: the end of a file or with a missing one are placed at that file's end or start
        self.damage_at: tuple[int, int] | None = None
        self._sum_fd: int | None = None  # the write file's side file (None: none, or checksums off for it)
        self._write_count = 0  # records in the write file before write_pos (the next entry's number)
        # The writer's position at the last inline sync that succeeded, and after one that failed, that position
        # (what was written since may be gone from the page cache: Linux drops the dirty pages of a failed fsync)
        self._synced_at: tuple[int, int] = (0, 0)
        self._suspect: tuple[int, int] | None = None

        self._depth = 0
        self._read_file_num = 0
        self._read_pos = 0
        self._write_file_num = 0
        self._write_pos = 0

        self._write_fd: int | None = None
        self._reader: SegmentReader | None = None  # the open read file
        # End of the read file when it is a complete file (not the write file); None until known.
        self._read_end: int | None = None
        # Blocking file work (fsync, meta file, removals, closing the old write file) runs there, in order; made
        # with the first job (``_submit``): most queues of a node with many topics never have any
        self._worker: FileWorker | None = None
        self._sync_failed = False  # the last background sync failed (sync_if_due tries again)

        self._ops = 0  # reads and writes since the last sync
        self._dirty = False  # anything changed since the last sync
        self._need_sync = False  # a change that must be synced at the end of the current call
        self._pending_since: float | None = None  # owner's clock, for sync_if_due
        self._closed = False

        # Hold mode: start of every record read since the committed position (file << _POS_BITS | pos), the token
        # of the first one, the acknowledged tokens beyond it, and the oldest data file not yet deleted. Without
        # hold mode they stay empty and immutable (no containers per queue: a node may have tens of thousands).
        self._held: deque[int] | tuple = deque() if hold_reads else ()
        self._held_base = 0
        self._acked: set[int] | frozenset = set() if hold_reads else _NO_NUMBERS
        self._oldest_file = 0
        # Hold mode: numbers of corrupt files skipped while records read from them may still be unacknowledged.
        self._bad_files: set[int] | frozenset = set() if hold_reads else _NO_NUMBERS
        # Set at start-up when the meta's read file had been removed after being read (``_load``): the depth the
        # meta counts for it is not data loss.
        self._removed_read_file: str | None = None

        self._meta_path = os.path.join(data_path, f"{name}.diskqueue.meta.dat")
        # the meta file's content as last read or written (None: there is none); ``close`` need not rewrite it
        self._saved_meta: bytes | None = None
        if known_files is None or f"{name}.diskqueue.meta.dat" in known_files:
            self._load()

    # -- names and introspection ---------------------------------------------------------------
    def file_name(self, file_num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{file_num:06d}.dat")

    @property
    def meta_file_name(self) -> str:
        return self._meta_path

    def depth(self) -> int:
        return self._depth

    def read_position(self) -> tuple[int, int]:
        """Where the reader is: ``(file number, byte position)``."""
        return self._read_file_num, self._read_pos

    def committed_position(self) -> tuple[int, int]:
        """Where a restart would resume reading: the oldest held record in hold mode, else the reader."""
        return self._committed()[:2]

    def write_position(self) -> tuple[int, int]:
        """Where the next record goes: ``(file number, byte position)``."""
        return self._write_file_num, self._write_pos

    @property
    def closed(self) -> bool:
        return self._closed

    def has_unread(self) -> bool:
        """True when ``read_many`` would find a record (or a corrupt file to skip). Can differ from
        ``depth() > 0`` only after metadata was lost or corrupted."""
        return (self._read_file_num, self._read_pos) < (self._write_file_num, self._write_pos)

    def statistics(self) -> DiskQueueStatistics:
        return DiskQueueStatistics(
            depth=self._depth,
            read_file_num=self._read_file_num,
            read_pos=self._read_pos,
            write_file_num=self._write_file_num,
            write_pos=self._write_pos,
            last_error=None if self.last_error is None else str(self.last_error),
            held=len(self._held),
            damaged=self.damaged,
        )

    # -- writing -------------------------------------------------------------------------------
    def put(self, data: bytes) -> None:
        """Append one record. ValueError for a bad length (nothing written); OSError from the disk (nothing
        counted, see the module notes); DiskQueueClosed after close."""
        if self._closed:
            raise DiskQueueClosed(self.name)
        size = len(data)
        if size < self.min_msg_size or size > self.max_msg_size:
            raise ValueError(f"invalid record size {size} (allowed {self.min_msg_size}..{self.max_msg_size})")
        before = self._position()
        try:
            if self._write_pos > 0 and self._write_pos + 4 + size > self.max_bytes_per_file:
                self._roll()
            self._write_at_end(_LENGTH.pack(size) + data, [data])
            self._write_pos += 4 + size
            self._depth += 1
            if not self._dirty:
                self._became_dirty()
            self._ops += 1
            if self._ops >= self.sync_every:
                if self.sync_every == 1:
                    self._sync()
                else:
                    self._sync_soon()
        except OSError as exc:
            self._undo_write(before)
            self._record_error("write", exc)
            raise
        self.last_error = None

    def put_many(self, records: list[bytes], *, defer_sync: bool = False) -> None:
        """Append records in order, all or none. One write system call per segment file touched. With
        ``defer_sync`` (and a barrier), a sync that falls due is left to ``barrier.commit()``."""
        if self._closed:
            raise DiskQueueClosed(self.name)
        if not records:
            return
        low, high = self.min_msg_size, self.max_msg_size
        for record in records:
            if not low <= len(record) <= high:
                raise ValueError(f"invalid record size {len(record)} (allowed {low}..{high})")
        before = self._position()
        pack = _LENGTH.pack
        limit = self.max_bytes_per_file
        try:
            parts: list[bytes] = []
            first = 0  # the first record of ``parts``
            pos = self._write_pos
            for index, record in enumerate(records):
                size = len(record)
                if pos > 0 and pos + 4 + size > limit:
                    if parts:
                        self._write_parts(parts, records[first:index])
                        parts = []
                    first = index
                    self._roll()
                    pos = 0
                parts.append(pack(size))
                parts.append(record)
                pos += 4 + size
            self._write_parts(parts, records[first:] if first else records)
            if not self._dirty:
                self._became_dirty()
            self._ops += len(records)
            if self._ops >= self.sync_every:
                if defer_sync and self.barrier is not None:
                    self.barrier.owe(self)
                elif self.sync_every == 1:
                    self._sync()
                else:
                    self._sync_soon()
        except OSError as exc:
            self._undo_write(before)
            self._record_error("write", exc)
            raise
        self.last_error = None

    def put_many_held(self, records: list[bytes]) -> int | None:
        """Hold mode: ``put_many``, and when the reader had read everything before them and they went into its
        file, take them as read at once (held, as ``read_many_held`` would return them) without reading them
        back: returns the token of the first record (the others follow it). None when they were only appended
        (the reader was behind, or the write moved to a new file): ``read_many_held`` returns them in order."""
        assert self.hold_reads, "put_many_held needs hold_reads=True"
        file_num, pos = self._write_file_num, self._write_pos
        caught_up = self._read_file_num == file_num and self._read_pos == pos and not self._closed
        self.put_many(records)
        if not caught_up or self._write_file_num != file_num:
            return None
        first = self._held_base + len(self._held)
        key = (file_num << _POS_BITS) + pos
        append = self._held.append
        for record in records:
            append(key)
            key += 4 + len(record)
        self._read_pos = self._write_pos
        self._depth -= len(records)
        reader = self._reader
        if reader is not None and reader.sums is not None:  # its side file's place follows the records taken
            reader.sums.index += len(records)
        return first

    def _write_parts(self, parts: list[bytes], records: list[bytes]) -> None:
        data = b"".join(parts)
        self._write_at_end(data, records)
        self._write_pos += len(data)
        self._depth += len(parts) // 2

    def _write_at_end(self, data: bytes, records: list[bytes]) -> None:
        """Write ``data`` (``records``, framed) at the writer's position, then their side file entries."""
        fd = self._write_fd
        if fd is None:
            fd = self._open_write_file()
        _write_fully(fd, data, self._write_pos, self.file_name(self._write_file_num))
        if self._sum_fd is not None:
            entries = entries_of(records)
            _write_fully(self._sum_fd, entries, self._write_count * 8, self.file_name(self._write_file_num))
        self._write_count += len(records)

    def _open_write_file(self) -> int:
        path = self.file_name(self._write_file_num)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._write_fd = fd
        self.log.info("DISKQUEUE(%s): writing %s", self.name, path)
        if self.checksums:
            self._open_side_file(path)
        if self._write_pos == 0:
            # the new file's name must survive a power cut before the meta names it: every later sync comes after
            self._submit(self._fsync_directory)
        return fd

    def _open_side_file(self, path: str) -> None:
        """The write file's side file, with the number of its next entry; none when the records already in the
        file are not all listed in it (nsqd wrote them): the file goes on unchecked rather than misnumbered."""
        self._write_count = 0
        if self._write_pos > 0:
            side = SideFile.open(path)
            lined_up = side is not None and side.seek(self._write_pos)
            if side is not None:
                self._write_count = side.index
                side.close()
            if not lined_up:
                self.log.info(
                    "DISKQUEUE(%s): %s has records without checksums, it goes on without them", self.name, path
                )
                return
        self._sum_fd = os.open(side_file_name(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.ftruncate(self._sum_fd, self._write_count * 8)  # entries of records cut back or never synced

    def _roll(self) -> None:
        """Move writing to the next file number, syncing first so the meta never lags behind a new file."""
        fd = self._write_fd
        if fd is not None:
            os.ftruncate(fd, self._write_pos)  # no-op unless a failed write left bytes past the end
        if self._read_file_num == self._write_file_num:
            self._read_end = self._write_pos
        sum_fd, self._sum_fd = self._sum_fd, None
        if sum_fd is not None:
            os.ftruncate(sum_fd, self._write_count * 8)
        self._write_file_num += 1
        self._write_pos = 0
        self._write_count = 0
        self._sync_soon(sum_fd)  # fsyncs the finished file (still open) and records the new file number
        if fd is not None:
            self._write_fd = None
            self._submit(partial(os.close, fd))  # after its fsync
        if sum_fd is not None:
            self._submit(partial(os.close, sum_fd))

    def _position(self) -> tuple[int, int, int, int | None, int, int]:
        return self._write_file_num, self._write_pos, self._depth, self._read_end, self._ops, self._write_count

    def _undo_write(self, before: tuple[int, int, int, int | None, int, int]) -> None:
        """Return to the state before a failed put: cut the file back, remove files the put began."""
        file_num, pos, depth, read_end, ops, count = before
        rolled = self._write_file_num != file_num
        if rolled:
            self._close_write_file()
            self._wait_worker()  # the roll's background sync names the files removed here: let it finish
            for num in range(file_num + 1, self._write_file_num + 1):
                _remove_quietly(self.file_name(num))
                _remove_quietly(side_file_name(self.file_name(num)))
            self._write_file_num = file_num
            # the meta written at the roll names the removed file and counts records cut below; refresh it
            self._need_sync = True
            if not self._dirty:
                self._became_dirty()
        self._write_pos = pos
        self._depth = depth
        self._read_end = read_end
        self._ops = ops
        self._write_count = count
        if self._read_file_num == file_num and self._reader is not None:
            self._reader.forget()
        try:
            if self._write_fd is not None:
                os.ftruncate(self._write_fd, pos)
                if self._sum_fd is not None:
                    os.ftruncate(self._sum_fd, count * 8)
            else:
                os.truncate(self.file_name(file_num), pos)
                if rolled and self.checksums and os.path.exists(side_file_name(self.file_name(file_num))):
                    os.truncate(side_file_name(self.file_name(file_num)), count * 8)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.log.warning(
                "DISKQUEUE(%s): could not cut %s back to %d - %s", self.name, self.file_name(file_num), pos, exc
            )

    # -- reading -------------------------------------------------------------------------------
    def read_many(self, max_count: int) -> list[bytes]:
        """Take up to ``max_count`` records, oldest first, advancing the read position. Corrupt files are
        renamed ``.bad`` and skipped (logged). Disk errors are logged and kept in ``last_error``; the records
        read so far are returned."""
        return self._read_into([], max_count)

    def read_split(self, max_count: int) -> SplitRecords:
        """``read_many``, each record split at the message header as it is parsed (``SplitRecords``: the broker
        builds its messages from the columns). Needs ``min_msg_size`` of at least the header."""
        if self.min_msg_size < SplitRecords.HEADER.size:
            raise ValueError(f"records of {self.min_msg_size} bytes are allowed: shorter than a message header")
        return self._read_into(SplitRecords(), max_count)

    def _read_into(self, records: _Records, max_count: int) -> _Records:
        if self._closed:
            raise DiskQueueClosed(self.name)
        while len(records) < max_count:
            reading_write_file = self._read_file_num == self._write_file_num
            if reading_write_file:
                if self._read_pos >= self._write_pos:
                    break
            elif self._read_file_num > self._write_file_num:
                break
            if self._reader is None and not self._open_read_file():
                break
            if self._reader is None:
                continue  # a missing file was skipped
            end = self._write_pos if reading_write_file else self._read_end
            assert end is not None
            if self._read_pos < end:
                if self.hold_reads:
                    problem = self._read_records_held(records, max_count, end)
                else:
                    problem = self._read_records(records, max_count, end)
                if isinstance(problem, Damaged):
                    self._damaged_record(problem)
                    continue
                if problem is not None:
                    self._skip_bad_file(problem)
                    continue
            if not reading_write_file and self._read_pos >= end:
                self._finish_read_file()
        if records or self._need_sync:
            self._check_tail()
        if self._need_sync or self._ops >= self.sync_every:
            self._sync_soon()
        return records

    def read_many_held(self, max_count: int) -> tuple[int, list[bytes]]:
        """``read_many`` in hold mode: also returns the token of the first record (the others follow it)."""
        assert self.hold_reads, "read_many_held needs hold_reads=True"
        first = self._held_base + len(self._held)
        return first, self.read_many(max_count)

    def read_split_held(self, max_count: int) -> tuple[int, SplitRecords]:
        """``read_split`` in hold mode, with the first record's token (``read_many_held``)."""
        assert self.hold_reads, "read_split_held needs hold_reads=True"
        first = self._held_base + len(self._held)
        return first, self.read_split(max_count)

    def _damaged_record(self, damage: Damaged) -> None:
        """A record whose checksum or length failed: reported, counted, never delivered; reading goes on after it."""
        self.log.error(
            "DISKQUEUE(%s): damaged record at byte %d of %s (%s), skipped: not delivered",
            self.name,
            damage.pos,
            self.file_name(self._read_file_num),
            damage.what,
        )
        self.damage_at = (self._read_file_num, damage.pos)
        self._read_pos = damage.skip_to
        if not self._dirty:
            self._became_dirty()
        self._lost(1, [damage.entry] if damage.entry is not None else None)

    def take_lost(self) -> LostRecords:
        """The records found damaged or lost since the last call (``lost``), handed over."""
        lost, self.lost = self.lost, None
        return lost if lost is not None else LostRecords()

    def _lost(self, count: int, entries: list[tuple[int, int]] | None) -> None:
        """``count`` records that cannot be read (damaged, or gone with a file cut short or missing), with their
        side file entries (None: not known)."""
        if count <= 0:
            return
        if self.lost is None:
            self.lost = LostRecords()
        self.lost.add(entries)
        self.damaged += count
        # records cut off past an unsynced meta were never in its depth (a crash mid-write): not below 0
        self._depth -= min(count, max(self._depth, 0))
        if self.on_damage is not None:
            self.on_damage(self, count)

    def _read_records_held(self, records: list[bytes] | SplitRecords, max_count: int, end: int) -> str | Damaged | None:
        """``_read_records``, then the start of each new record joins the held window (its ops do not count)."""
        before = len(records)
        pos = self._read_pos
        ops = self._ops
        problem = self._read_records(records, max_count, end)
        self._ops = ops
        key = (self._read_file_num << _POS_BITS) + pos
        append = self._held.append
        if isinstance(records, SplitRecords):
            rest, header = records.bodies, 4 + SplitRecords.HEADER.size
        else:
            rest, header = records, 4
        for index in range(before, len(rest)):
            append(key)
            key += header + len(rest[index])
        return problem

    def ack(self, token: int) -> None:
        """Hold mode: the record read under ``token`` is no longer needed. Unknown or repeated tokens (from before
        an ``empty``, say) are ignored."""
        offset = token - self._held_base
        held = self._held
        if offset < 0 or offset >= len(held) or self._closed:
            return
        if offset:
            self._acked.add(token)
            return
        acked = self._acked
        held.popleft()
        base = token + 1
        while acked and base in acked:
            acked.remove(base)
            held.popleft()
            base += 1
        self._held_base = base
        if not self._dirty:
            self._became_dirty()
        self._release_files()

    def ack_range(self, first: int, count: int) -> None:
        """Hold mode: acknowledge ``count`` consecutive tokens from ``first``."""
        for token in range(first + count - 1, first - 1, -1):
            self.ack(token)  # last first, so the window is popped once, at the end

    def _committed(self) -> tuple[int, int, int]:
        """The position and depth the meta file records: the oldest held record's, else the reader's."""
        held = self._held
        if held:
            key = held[0]
            return key >> _POS_BITS, key & _POS_MASK, self._depth + len(held)
        return self._read_file_num, self._read_pos, self._depth

    def _release_files(self) -> None:
        """Hold mode: delete the data files wholly behind the committed position (corrupt ones become ``.bad``)."""
        held = self._held
        committed_file = held[0] >> _POS_BITS if held else self._read_file_num
        if self._oldest_file < committed_file:
            self._sync_soon()  # the meta past the files first, as in ``_finish_read_file``
        while self._oldest_file < committed_file:
            num = self._oldest_file
            if num in self._bad_files:
                self._bad_files.discard(num)
                self._submit(partial(self._set_aside_bad_file, self.file_name(num)))
            else:
                self._submit(partial(self._remove_data_file, self.file_name(num)))
            self._oldest_file += 1

    def _read_records(self, records: list[bytes] | SplitRecords, max_count: int, end: int) -> str | Damaged | None:
        """Parse records from the read file into ``records`` until ``end`` or ``max_count``; returns a
        description of the corruption that stopped it, or None."""
        before = len(records)
        self._read_pos, problem = self._reader.take(
            records, self._read_pos, max_count, end, self.min_msg_size, self.max_msg_size
        )
        taken = len(records) - before
        self._depth -= taken
        self._ops += taken
        if taken and not self._dirty:
            self._became_dirty()
        return problem

    def _open_read_file(self) -> bool:
        """Open the read file; False when reading cannot go on now (the error is logged)."""
        path = self.file_name(self._read_file_num)
        try:
            try:
                fd = os.open(path, _READ_FLAGS)
            except PermissionError:
                fd = os.open(path, _READ_FLAGS_PLAIN)
        except FileNotFoundError:
            self.damage_at = (self._read_file_num, self._read_pos)  # also for the depth found short at the tail
            self._missing_file_lost(path)
            if self._read_file_num < self._write_file_num:
                self.log.error("DISKQUEUE(%s): %s is missing, skipping to the next file", self.name, path)
                self._advance_read_file()
            else:
                self._skip_bad_file("the write file is missing")
            return True
        except OSError as exc:
            self._record_error("open for reading", exc)
            return False
        sums = SideFile.open(path) if self.checksums else None
        if sums is not None and self._read_pos and not sums.seek(self._read_pos):
            self.log.warning(
                "DISKQUEUE(%s): the checksums of %s do not match its records, reading it unchecked", self.name, path
            )
            sums.close()
            sums = None
        self._reader = SegmentReader(fd, path, self.name, self.log, sums)
        if self._read_file_num < self._write_file_num and self._read_end is None:
            self._read_end = os.fstat(fd).st_size
        return True

    def _missing_file_lost(self, path: str) -> None:
        """A segment gone (deleted, or never synced): its side file, when left, says how many records it held."""
        sums = SideFile.open(path) if self.checksums else None
        if sums is None:
            return
        try:
            if not self._read_pos or sums.seek(self._read_pos):
                lost = sums.entries_from(sums.index)
                if lost:
                    self.log.error("DISKQUEUE(%s): %s is missing: %d record(s) lost", self.name, path, len(lost))
                    self._lost(len(lost), lost)
        finally:
            sums.close()

    def _finish_read_file(self) -> None:
        """The reader has passed the end of a complete file: delete it (in hold mode, once nothing in it is held)
        and move on. Records its side file lists beyond its end were lost with the part of it cut off."""
        reader = self._reader
        if reader is not None and reader.sums is not None:
            lost = reader.lost_at_end()
            if lost:
                self.log.error(
                    "DISKQUEUE(%s): %s ends at %d but its checksums list %d more record(s): lost",
                    self.name,
                    self.file_name(self._read_file_num),
                    self._read_pos,
                    len(lost),
                )
                self.damage_at = (self._read_file_num, self._read_pos)
                self._lost(len(lost), lost)
        if self.hold_reads:
            self._advance_read_file()
            self._release_files()
            return
        done = self.file_name(self._read_file_num)
        self._advance_read_file()
        # The meta file naming the next file goes first: a process killed during the removal then leaves the
        # meta past the file (removed at the next start), never naming a file that is gone or cut short.
        self._sync_soon()
        # unlink frees the file's blocks (milliseconds for a full segment): off the loop
        self._submit(partial(self._remove_data_file, done))

    def _remove_data_file(self, path: str) -> None:
        """Runs on the worker."""
        try:
            remove_in_steps(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.log.error("DISKQUEUE(%s): failed to remove %s - %s", self.name, path, exc)
        if self.checksums:
            _remove_quietly(side_file_name(path))

    def _advance_read_file(self) -> None:
        self._close_read_file()
        self._read_file_num += 1
        self._read_pos = 0
        self._read_end = None
        if not self._dirty:
            self._became_dirty()
        self._need_sync = True

    def _skip_bad_file(self, problem: str) -> None:
        num = self._read_file_num
        path = self.file_name(num)
        self.log.error(
            "DISKQUEUE(%s): %s at %d of %s; renaming it to %s.bad and skipping to the next file",
            self.name,
            problem,
            self._read_pos,
            path,
            path,
        )
        self.damage_at = (num, self._read_pos)
        reader = self._reader
        if reader is not None and reader.sums is not None:
            lost = reader.lost_at_end()
            if lost:
                self.log.error("DISKQUEUE(%s): %d record(s) of %s lost", self.name, len(lost), path)
                self._lost(len(lost), lost)
        if self._read_file_num == self._write_file_num:
            # the write file itself is damaged: nothing more goes into it
            self._close_write_file()
            self._write_file_num += 1
            self._write_pos = 0
        self._advance_read_file()
        if self.hold_reads:
            # The records read from it before the damage may not be acknowledged yet, and a restart reads them again
            # from the committed position: the file keeps its name until the committed position has passed it.
            self._bad_files.add(num)
            self._release_files()
        else:
            self._set_aside_bad_file(path)
        self._check_tail()

    def _set_aside_bad_file(self, path: str) -> None:
        """Rename a corrupt file ``<file>.bad`` (inline, or on the worker in hold mode)."""
        try:
            os.rename(path, path + ".bad")
        except FileNotFoundError:
            pass  # a missing file was skipped: nothing to set aside
        except OSError as exc:
            self.log.error("DISKQUEUE(%s): failed to rename %s - %s", self.name, path, exc)
        if self.checksums:
            with contextlib.suppress(OSError):
                os.rename(side_file_name(path), side_file_name(path + ".bad"))

    def _check_tail(self) -> None:
        """At the writer, depth must be 0; a reader beyond the writer means the positions are corrupt."""
        reader = (self._read_file_num, self._read_pos)
        writer = (self._write_file_num, self._write_pos)
        if reader < writer:
            return
        removed, self._removed_read_file = self._removed_read_file, None
        if self._depth != 0:
            if self._depth > 0 and removed is not None:
                self.log.warning(
                    "DISKQUEUE(%s): %d record(s) counted at the tail were in %s, read and removed "
                    "before the last stop; resetting the depth to 0",
                    self.name,
                    self._depth,
                    removed,
                )
            elif self._depth < 0:
                self.log.error(
                    "DISKQUEUE(%s): negative depth at the tail (%d), metadata corruption, resetting to 0",
                    self.name,
                    self._depth,
                )
            else:
                self.log.error(
                    "DISKQUEUE(%s): positive depth at the tail (%d), data loss, resetting to 0", self.name, self._depth
                )
                if self.damage_at is None:
                    self.damage_at = reader
                self._lost(self._depth, None)
            self._depth = 0
            if not self._dirty:
                self._became_dirty()
            self._need_sync = True
        if reader != writer:
            self.log.error(
                "DISKQUEUE(%s): read position %d,%d is beyond write position %d,%d, corruption, "
                "skipping both to a new file",
                self.name,
                *reader,
                *writer,
            )
            self._remove_data_files()
            if not self._dirty:
                self._became_dirty()
            self._need_sync = True

    # -- durability ----------------------------------------------------------------------------
    def sync(self) -> None:
        """fsync the write file, then rewrite the meta file atomically. Raises OSError (kept in last_error)."""
        try:
            self._sync()
        except OSError as exc:
            self._record_error("sync", exc)
            raise

    def _sync(self) -> None:
        """Sync now, on the caller's thread: on disk when it returns (after the background work before it).
        After a failed fsync the bytes written since the last good one are written again first: the kernel
        may have dropped them (marked clean, never written) when it reported the error."""
        if self._worker is not None:
            self._worker.discard_last(("sync", self._write_fd))  # superseded by this one
        self._wait_worker()
        fd = self._write_fd
        if fd is not None:
            try:
                if self._suspect is not None:
                    self._rewrite_suspect(fd)
                _fsync(fd)
                if self._sum_fd is not None:
                    # the checksums of what this sync makes durable: after a power cut every record acknowledged
                    # has its entry, so none of them is read unchecked (a second fsync, of a file of 8 bytes a
                    # record: its cost is in bench/README.md, "Record checksums")
                    _fsync(self._sum_fd)
            except OSError:
                if self._suspect is None:
                    self._suspect = self._synced_at
                raise
            self._suspect = None
            self._synced_at = (self._write_file_num, self._write_pos)
        meta = self._meta_text()
        replace_file(self._meta_path, meta)
        self._saved_meta = meta
        self._ops = 0
        self._dirty = False
        self._need_sync = False
        self._pending_since = None
        self._sync_failed = False
        self.last_error = None

    def _rewrite_suspect(self, fd: int) -> None:
        """Write again what the write file holds from the last good sync on (the whole file if that was in an
        earlier one, whose own fsync ran on the worker when writing moved on)."""
        assert self._suspect is not None  # set by the failed sync that asks for this
        file_num, pos = self._suspect
        start = pos if file_num == self._write_file_num else 0
        if start >= self._write_pos:
            return
        data = os.pread(fd, self._write_pos - start, start)
        _write_fully(fd, data, start, self.file_name(self._write_file_num))
        self.log.warning(
            "DISKQUEUE(%s): %d byte(s) of %s written since the last good sync written again after a failed sync",
            self.name,
            len(data),
            self.file_name(self._write_file_num),
        )

    def _sync_soon(self, sum_fd: int | None = None) -> None:
        """Sync on the worker: the meta file as the queue is now, after everything done so far. Nothing waits for
        it; what must be on disk before an acknowledgement goes through ``_sync`` (``sync_every=1``, the barrier).
        Errors are logged and kept in ``last_error``. The side file of checksums is synced here too (``sum_fd``:
        that of a file just finished), as by the inline sync: see ``checksums.py``."""
        fd = self._write_fd
        if sum_fd is None:
            sum_fd = self._sum_fd
        self._submit(
            partial(self._sync_files, fd, self._meta_text(), sum_fd), self._background_sync_failed, key=("sync", fd)
        )
        self._ops = 0
        self._dirty = False
        self._need_sync = False
        self._pending_since = None

    def _sync_files(self, fd: int | None, meta: bytes, sum_fd: int | None = None) -> None:
        """Runs on the worker. ``fd`` and ``sum_fd`` are still open: they are closed only by a later job."""
        if fd is not None:
            os.fsync(fd)
        if sum_fd is not None:
            os.fsync(sum_fd)
        replace_file(self._meta_path, meta)
        self._saved_meta = meta
        if self._sync_failed:
            self._sync_failed = False
            self.last_error = None

    def _became_dirty(self) -> None:
        self._dirty = True
        if self.active is not None:
            self.active[self] = None

    @property
    def owes_sync(self) -> bool:
        """Changes not synced yet, or a failed background sync to try again (``sync_if_due`` has work)."""
        return (self._dirty or self._sync_failed) and not self._closed

    def _background_sync_failed(self, exc: OSError) -> None:
        self._sync_failed = True
        if self.active is not None:
            self.active[self] = None  # the owner's sync_if_due tries again
        self._record_error("sync", exc)

    def sync_if_due(self, now: float) -> bool:
        """Sync when changes have been pending for ``sync_timeout`` on the caller's clock; call it periodically
        (say every second). The sync runs on the worker; its errors are logged and kept in ``last_error``, not
        raised. True when it started one."""
        if self._sync_failed and not self._closed and not self._dirty:  # try again after another sync_timeout
            self._became_dirty()
        if self._closed or not self._dirty:
            self._pending_since = None
            return False
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since < self.sync_timeout:
            return False
        self._sync_soon()
        return True

    def _meta_text(self) -> bytes:
        read_num, read_pos, depth = self._committed()
        return (f"{depth}\n{read_num},{read_pos}\n{self._write_file_num},{self._write_pos}\n").encode("ascii")

    def wait_idle(self) -> None:
        """Block until the file work handed to the worker so far (syncs, removals) has run."""
        self._wait_worker()

    def _submit(self, job, on_error=None, *, key: object = None) -> None:
        """Hand ``job`` to the worker (``FileWorker.submit``), which the first job creates."""
        worker = self._worker
        if worker is None:
            worker = self._worker = FileWorker(self.name, self.log)
        worker.submit(job, on_error, key=key)

    def _wait_worker(self) -> None:
        if self._worker is not None:
            self._worker.wait_idle()

    def _fsync_directory(self) -> None:
        try:
            fd = os.open(self.data_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass  # some file systems cannot sync a directory; the data file sync still happens
        finally:
            os.close(fd)

    def _record_error(self, action: str, exc: OSError) -> None:
        self.last_error = exc
        if self.failing is not None:
            self.failing[self] = None
        self.log.error("DISKQUEUE(%s): %s failed - %s", self.name, action, exc)

    # -- lifecycle -----------------------------------------------------------------------------
    def empty(self) -> None:
        """Drop every record: delete the data files from the read file to the write file and the meta file.
        File numbering continues after the old write file."""
        if self._closed:
            raise DiskQueueClosed(self.name)
        self.log.info("DISKQUEUE(%s): emptying", self.name)
        self._remove_data_files()
        _remove_quietly(self._meta_path)
        self._saved_meta = None
        self._ops = 0
        self._dirty = False
        self._need_sync = False
        self._pending_since = None

    def close(self) -> None:
        """Sync and close the files; the meta file is left for every queue, even an empty one, as nsqd does. A
        graceful stop of 10,000 idle topics must not cost 10,000 fsyncs, though: a queue with nothing to sync
        whose meta file already says what it would write skips it, and one that has never held a record writes
        its meta file without an fsync (if a power cut loses that file, a restart reads the same empty queue)."""
        if self._closed:
            return
        self.log.info("DISKQUEUE(%s): closing", self.name)
        try:
            meta = self._meta_text()
            if (
                self._dirty
                or self._sync_failed
                or (self._worker is not None and self._worker.busy)
                or (meta != self._saved_meta and meta != _EMPTY_META)
            ):
                self.sync()
            elif meta != self._saved_meta:
                try:
                    replace_file(self._meta_path, meta, sync=False)
                except OSError as exc:
                    self._record_error("sync", exc)
                    raise
                self._saved_meta = meta
        finally:
            self._closed = True
            self._close_read_file()
            self._close_write_file()
            self._wait_worker()

    def delete(self) -> None:
        """Remove the queue's data and meta files and close it; no file of it is left (``.bad`` files aside)."""
        if self._closed:
            raise DiskQueueClosed(self.name)
        self.log.info("DISKQUEUE(%s): deleting", self.name)
        self.empty()
        self._closed = True

    def _remove_data_files(self) -> None:
        """Delete files read..write and put both positions at the start of a fresh file number."""
        self._close_read_file()
        self._close_write_file()
        self._wait_worker()  # nothing of the worker's may write the meta file or use a descriptor after this
        first, last = self._read_file_num, self._write_file_num
        if self.hold_reads:
            first = min(first, self._oldest_file)
            self._held_base += len(self._held)  # outstanding tokens become stale
            self._held.clear()
            self._acked.clear()
            self._bad_files.clear()
        for num in range(first, last + 1):
            path = self.file_name(num)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.log.error("DISKQUEUE(%s): failed to remove %s - %s", self.name, path, exc)
            if self.checksums:
                _remove_quietly(side_file_name(path))
        fresh = max(first, last) + 1
        self._read_file_num = self._write_file_num = fresh
        self._read_pos = self._write_pos = 0
        self._read_end = None
        self._depth = 0
        self._oldest_file = fresh

    def _close_read_file(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()  # after its read ahead, if one is running

    def _close_write_file(self) -> None:
        """On the worker, after the syncs already handed to it (which may fsync this descriptor)."""
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            self._submit(partial(os.close, fd))
        sum_fd, self._sum_fd = self._sum_fd, None
        if sum_fd is not None:
            self._submit(partial(os.close, sum_fd))

    # -- start-up ------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            with open(self._meta_path, "rb") as f:
                raw = f.read()
            text = raw.decode("ascii")
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            self.log.error("DISKQUEUE(%s): cannot read %s - %s; starting empty", self.name, self._meta_path, exc)
            return
        try:
            depth_line, read_line, write_line = text.split("\n")[:3]
            depth = int(depth_line)
            read_num, read_pos = (int(v) for v in read_line.split(","))
            write_num, write_pos = (int(v) for v in write_line.split(","))
            if min(read_num, read_pos, write_num, write_pos) < 0:
                raise ValueError("negative position")
        except ValueError as exc:
            self.log.error(
                "DISKQUEUE(%s): cannot parse %s (%r) - %s; starting empty", self.name, self._meta_path, text[:80], exc
            )
            return
        self._depth = depth
        self._read_file_num, self._read_pos = read_num, read_pos
        self._write_file_num, self._write_pos = write_num, write_pos
        self._saved_meta = raw
        self._remove_read_files(read_num)
        if read_num < write_num:
            self._skip_removed_read_files()
        self._oldest_file = self._read_file_num

        path = self.file_name(write_num)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = 0
        if size > write_pos:
            salvaged = self._count_records(path, write_pos, size)
            self.log.warning(
                "DISKQUEUE(%s): %s is %d bytes but the metadata says %d; %d unsynced record(s) "
                "kept, writing continues in a new file",
                self.name,
                path,
                size,
                write_pos,
                salvaged,
            )
            self._depth += salvaged
            self._write_file_num += 1
            self._write_pos = 0
            self._need_sync = True
        elif size < write_pos:
            self.log.error(
                "DISKQUEUE(%s): %s is %d bytes but the metadata says %d; writing continues in a new file",
                self.name,
                path,
                size,
                write_pos,
            )
            self._write_file_num += 1
            self._write_pos = 0
            self._need_sync = True
        # The meta file of a roll is written by the worker, after the new file may have got data: a process that
        # died in between left files after the meta's write file, with records written since the last sync.
        later = self._later_files(write_num)
        if later:
            salvaged = sum(self._count_records(self.file_name(num), 0, end) for num, end in later)
            self.log.warning(
                "DISKQUEUE(%s): %d file(s) after %s are not in the metadata yet; %d unsynced record(s) "
                "kept, writing continues in a new file",
                self.name,
                len(later),
                path,
                salvaged,
            )
            self._depth += salvaged
            self._write_file_num = later[-1][0] + 1
            self._write_pos = 0
            self._need_sync = True
        self._check_tail()
        if self._need_sync:
            try:
                self._sync()
            except OSError as exc:
                self._record_error("sync", exc)

    def _remove_read_files(self, num: int) -> None:
        """Start-up: remove the data files before file ``num``, the meta's read file. The meta file that moves
        the reader past a file is written before the file is removed, so a process killed in between leaves
        them behind; everything in them was read."""
        while num > 0:
            num -= 1
            path = self.file_name(num)
            if not os.path.exists(path):
                return
            self.log.info("DISKQUEUE(%s): removing %s, read before the last stop but not yet removed", self.name, path)
            self._submit(partial(self._remove_data_file, path))

    def _skip_removed_read_files(self) -> None:
        """Start-up: a complete read file that is missing, or shorter than the read position, was being removed
        after it had been read when the process stopped, before the meta file recorded the move (go-diskqueue
        removes a file before it syncs; so did this queue after a failed sync). Nothing was lost: reading goes on
        with the next file, and the records the meta still counts for it are not taken for data loss at the tail.
        """
        while self._read_file_num < self._write_file_num:
            path = self.file_name(self._read_file_num)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = None
            if size is not None and size >= self._read_pos:
                return
            self.log.warning(
                "DISKQUEUE(%s): %s is %s, before the read position %d of the metadata: it was "
                "removed after being read; reading goes on with the next file",
                self.name,
                path,
                "missing" if size is None else f"{size} bytes",
                self._read_pos,
            )
            if size is not None:
                self._submit(partial(self._remove_data_file, path))
            self._read_file_num += 1
            self._read_pos = 0
            self._removed_read_file = path
            self._need_sync = True

    def _later_files(self, num: int) -> list[tuple[int, int]]:
        """``(number, size)`` of the data files that follow file ``num`` without a gap."""
        found = []
        while True:
            num += 1
            try:
                found.append((num, os.stat(self.file_name(num)).st_size))
            except FileNotFoundError:
                return found

    def _count_records(self, path: str, start: int, end: int) -> int:
        """Whole, valid records between ``start`` and ``end`` of a file (only their lengths are read)."""
        count = 0
        pos = start
        with open(path, "rb") as f:
            while pos + 4 <= end:
                f.seek(pos)
                (size,) = _LENGTH.unpack(f.read(4))
                if size < self.min_msg_size or size > self.max_msg_size or pos + 4 + size > end:
                    break
                pos += 4 + size
                count += 1
        return count


def _write_fully(fd: int, data: bytes, pos: int, path: str) -> None:
    done = os.pwrite(fd, data, pos)
    if done < len(data):
        # a short write (the disk filled up mid-way): retry the rest, which raises the real error
        view = memoryview(data)
        while done < len(view):
            more = os.pwrite(fd, view[done:], pos + done)
            if more == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            done += more


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
