"""The write-ahead log between nsqd and Spark: every message is here, on disk, before Spark sees it.

Layout of ``walPath``::

    LOCK                      flock'ed by the one process that owns the log (Spark's source runner)
    committed.json            the offset of Spark's latest commit, replaced atomically
    <quoted host:port>/       one log per nsqd (one Spark partition per nsqd)
        00000000000000000000.wal   segment files, named by the position of their first message

Positions count messages from 0 in each log. A segment starts with an 8-byte magic and holds
records framed as ``[uint32 length][uint32 CRC-32][payload]`` (big-endian), the payload being a
``Batch`` protobuf (``wal.proto``) of consecutive messages. A record is written in the packed
layout: its numeric columns are little-endian arrays in bytes fields, and ``append`` writes the
protobuf encoding itself from whole buffers (a handful of length-prefixed fields), since building
a ``Batch`` message costs a conversion per message and field; records of the older repeated
layout are still read. Appends go to the newest segment
until it passes ``segment_bytes``; ``sync()`` makes everything appended so far durable (fsync of
the file, and of the directory when a segment was created) and only then moves ``synced_end``,
the limit of what the reader may hand to Spark and what the consumer may FIN in durable mode.

Recovery (``open``) scans every segment. A torn or corrupt tail of the newest segment is what a
crash during an append leaves: it is cut off and logged, and it is never lost, because nothing in
it was synced, so nothing in it was FIN'd nor offered to Spark (nsqd delivers it again). Damage
anywhere else (inside a record that is followed by valid ones, in an older segment, a gap in
positions) means synced data is gone, and ``WalCorruptError`` stops the query with the file and
the byte offset instead of silently skipping messages.

Segments are deleted by ``delete_before(position)`` once Spark's commit covers them entirely.

Redeliveries: each log remembers the ids of its most recent messages (``dedup_window`` of them,
seeded at recovery from the retained segments) with their positions, so that a copy nsqd
delivers again (a FIN lost with a connection, a restart) is recognised by (nsqd, id) and dropped.
The ids are kept a record at a time; the id -> position index is brought up to date only when
an id not above the greatest logged one arrives (a redelivered copy, or a deferred message), so
a first delivery from an nsqd whose ids increase costs one comparison.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import itertools
import json
import logging
import os
import struct
import sys
import threading
import time
import urllib.parse
import zlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from . import wal_pb2

__all__ = [
    "SEGMENT_MAGIC",
    "Columns",
    "MessageLog",
    "WalCorruptError",
    "WalDirectory",
    "WalError",
    "WalLockedError",
]

log = logging.getLogger("spark_connector.wal")

SEGMENT_MAGIC = b"TNSQWAL1"
SEGMENT_SUFFIX = ".wal"
_RECORD_HEADER = struct.Struct(">II")
_MAX_RECORD = 1 << 30
ID_SIZE = 16
_LITTLE_ENDIAN = sys.byteorder == "little"
# Protobuf keys (field number << 3 | wire type) of the Batch fields a packed record holds.
_KEY_FIRST_POSITION = b"\x08"
_KEY_NSQD, _KEY_TOPIC, _KEY_CHANNEL, _KEY_IDS = b"\x12", b"\x1a", b"\x22", b"\x2a"
_KEY_BODIES, _KEY_TIMESTAMPS, _KEY_ATTEMPTS, _KEY_BODY_SIZES = b"\x4a", b"\x52", b"\x5a", b"\x62"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _le_array(typecode: str, data: bytes) -> array:
    """An array of the little-endian values in ``data`` (a packed column)."""
    out = array(typecode)
    out.frombytes(data)
    if not _LITTLE_ENDIAN:
        out.byteswap()
    return out


def _le_bytes(values: array) -> bytes:
    if not _LITTLE_ENDIAN:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


class WalError(Exception):
    """The write-ahead log cannot be used as it is; the message says why and what to do."""


class WalCorruptError(WalError):
    """Synced records are damaged: continuing would silently lose messages."""


class WalLockedError(WalError):
    """Another live process owns this walPath."""


@dataclass
class Columns:
    """Consecutive messages of one log, column by column (the shape of a ``Batch``)."""

    ids: bytes = b""
    timestamps: array = field(default_factory=lambda: array("q"))
    attempts: array = field(default_factory=lambda: array("H"))
    body_sizes: array = field(default_factory=lambda: array("I"))
    bodies: bytes = b""

    def __len__(self) -> int:
        return len(self.timestamps)

    @classmethod
    def from_batch(cls, batch: wal_pb2.Batch) -> Columns:
        """The columns of a record of either layout; ValueError when they disagree in length."""
        ids = batch.ids
        count = len(ids) // ID_SIZE
        if batch.timestamps_le or batch.attempts_le or batch.body_sizes_le or not batch.timestamps:
            columns = cls(
                ids,
                _le_array("q", batch.timestamps_le),
                _le_array("H", batch.attempts_le),
                _le_array("I", batch.body_sizes_le),
                batch.bodies,
            )
        else:  # the repeated layout of older logs
            columns = cls(
                ids,
                array("q", batch.timestamps),
                array("H", batch.attempts),
                array("I", batch.body_sizes),
                batch.bodies,
            )
        if (
            len(ids) % ID_SIZE
            or len(columns.timestamps) != count
            or len(columns.attempts) != count
            or len(columns.body_sizes) != count
            or sum(columns.body_sizes) != len(columns.bodies)
        ):
            raise ValueError("columns of different lengths")
        return columns

    def slice(self, start: int, stop: int) -> Columns:
        """Messages [start, stop) of this chunk (indexes within the chunk)."""
        if start == 0 and stop >= len(self):
            return self
        sizes = self.body_sizes
        body_start = sum(sizes[:start])
        body_stop = body_start + sum(sizes[start:stop])
        return Columns(
            self.ids[start * ID_SIZE : stop * ID_SIZE],
            self.timestamps[start:stop],
            self.attempts[start:stop],
            sizes[start:stop],
            self.bodies[body_start:body_stop],
        )

    @classmethod
    def concat(cls, parts: list[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        out = cls()
        for part in parts:
            out.timestamps.extend(part.timestamps)
            out.attempts.extend(part.attempts)
            out.body_sizes.extend(part.body_sizes)
        out.ids = b"".join(p.ids for p in parts)
        out.bodies = b"".join(p.bodies for p in parts)
        return out


@dataclass
class _Record:
    first: int
    count: int
    offset: int  # byte offset of the record header in its segment
    length: int  # payload length


@dataclass
class _Segment:
    path: Path
    first: int
    records: list[_Record]
    size: int

    @property
    def end(self) -> int:
        return self.records[-1].first + self.records[-1].count if self.records else self.first


class MessageLog:
    """One nsqd's log. The consumer thread appends and syncs; Spark's driver calls read and
    delete from another thread, so the index is guarded by a lock (file I/O happens outside it)."""

    def __init__(
        self, directory: Path, nsqd: str, topic: str, channel: str, *, segment_bytes: int, dedup_window: int
    ) -> None:
        self.directory = directory
        self.nsqd = nsqd
        self.topic = topic
        self.channel = channel
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._file: io.BufferedRandom | None = None  # the newest segment, open for appending
        self._dir_dirty = False
        self.end = 0  # position after the last appended message
        self.synced_end = 0  # position after the last durable message
        self._dedup_window = dedup_window
        # The remembered ids, a record per item: (position of the first, ids), oldest first.
        self._recent: deque[tuple[int, list[bytes]]] = deque()
        self._recent_count = 0
        self._recent_total = 0  # records ever remembered
        # The greatest id ever logged: an id above it was never seen, which is what a first
        # delivery is when the nsqd's ids increase (nsqd's do, per topic), so the consumer
        # looks an id up only when it is not above it.
        self.top_id = b""
        self._index: dict[bytes, int] = {}  # id -> position, built at the first look-up
        self._indexed_total = 0  # records of _recent in _index
        self.truncated_bytes = 0  # bytes of torn tail cut at recovery
        # The fields every record of this log repeats, encoded once.
        self._record_names = b"".join(
            key + _varint(len(text)) + text
            for key, text in (
                (_KEY_NSQD, nsqd.encode()),
                (_KEY_TOPIC, topic.encode()),
                (_KEY_CHANNEL, channel.encode()),
            )
        )

    # -- recovery --------------------------------------------------------------------------

    def open(self) -> MessageLog:
        self.directory.mkdir(parents=True, exist_ok=True)
        paths = sorted(p for p in self.directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        expected = None
        for i, path in enumerate(paths):
            is_last = i == len(paths) - 1
            segment = self._scan(path, is_last)
            if expected is not None and segment.first != expected:
                raise WalCorruptError(
                    f"write-ahead log {self.directory}: segment {path.name} starts at position "
                    f"{segment.first} but the previous one ends at {expected}; messages are missing"
                )
            expected = segment.end
            self._segments.append(segment)
        if self._segments:
            self.end = self.synced_end = self._segments[-1].end
            last = self._segments[-1]
            self._file = open(last.path, "r+b")  # noqa: SIM115 - the open segment, closed by _new_segment or close
            self._file.seek(last.size)
            self._file.truncate()
        return self

    def _scan(self, path: Path, is_last: bool) -> _Segment:
        try:
            first = int(path.name[: -len(SEGMENT_SUFFIX)])
        except ValueError:
            raise WalCorruptError(f"write-ahead log {self.directory}: unexpected file {path.name}") from None
        data = path.read_bytes()
        if data[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC:
            if is_last and len(data) < len(SEGMENT_MAGIC) and SEGMENT_MAGIC.startswith(data):
                # Created but its header never made it to disk: an empty segment.
                self.truncated_bytes += len(data)
                with open(path, "wb") as f:
                    f.write(SEGMENT_MAGIC)
                    f.flush()
                    os.fsync(f.fileno())
                return _Segment(path, first, [], len(SEGMENT_MAGIC))
            raise WalCorruptError(f"write-ahead log segment {path} has no valid header")
        records: list[_Record] = []
        pos = len(SEGMENT_MAGIC)
        position = first
        while pos < len(data):
            problem = None
            if len(data) - pos < _RECORD_HEADER.size:
                problem = "a truncated record header"
            else:
                length, crc = _RECORD_HEADER.unpack_from(data, pos)
                payload = data[pos + _RECORD_HEADER.size : pos + _RECORD_HEADER.size + length]
                if length > _MAX_RECORD or len(payload) < length:
                    problem = "a truncated record"
                elif zlib.crc32(payload) != crc:
                    problem = "a record with a bad checksum"
                else:
                    try:
                        batch = wal_pb2.Batch.FromString(payload)
                        Columns.from_batch(batch)
                    except Exception:  # any decode failure is corruption
                        problem = "an undecodable record"
                    else:
                        if batch.first_position != position:
                            problem = f"a record at position {batch.first_position}, expected {position}"
            if problem is not None:
                if not is_last or self._valid_record_follows(data, pos + 1):
                    raise WalCorruptError(
                        f"write-ahead log segment {path} has {problem} at byte {pos} "
                        f"(position {position}) followed by more data: synced messages are damaged; "
                        f"refusing to continue. Move the walPath aside to start over (messages it "
                        f"held that Spark had not committed must then be recovered by hand)"
                    )
                self.truncated_bytes += len(data) - pos
                log.warning(
                    "write-ahead log %s: cut a torn tail of %d bytes (%s at byte %d); it was never "
                    "synced, so nsqd still owns those messages and delivers them again",
                    path,
                    len(data) - pos,
                    problem,
                    pos,
                )
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    f.flush()
                    os.fsync(f.fileno())
                break
            count = len(batch.ids) // ID_SIZE
            records.append(_Record(position, count, pos, length))
            ids = batch.ids
            self._remember([ids[i : i + ID_SIZE] for i in range(0, len(ids), ID_SIZE)], position)
            position += count
            pos += _RECORD_HEADER.size + length
        return _Segment(path, first, records, pos)

    @staticmethod
    def _valid_record_follows(data: bytes, start: int) -> bool:
        """Whether a CRC-valid record starts somewhere after a damaged one (then the damage is
        not a torn tail but lost synced data)."""
        for pos in range(start, len(data) - _RECORD_HEADER.size):
            length, crc = _RECORD_HEADER.unpack_from(data, pos)
            end = pos + _RECORD_HEADER.size + length
            if (
                0 < length <= len(data) - pos - _RECORD_HEADER.size
                and end <= len(data)
                and zlib.crc32(data[pos + _RECORD_HEADER.size : end]) == crc
            ):
                return True
        return False

    # -- redelivered copies ----------------------------------------------------------------

    def _remember(self, ids: list[bytes], first: int) -> None:
        """Remember the ids of one record (positions from ``first``), forgetting the oldest ones
        beyond ``dedup_window``. Nothing is hashed here: the id -> position index is brought up
        to date by the look-ups, which only ids not above ``top_id`` need."""
        window = self._dedup_window
        if window <= 0 or not ids:
            return
        top = max(ids)
        if top > self.top_id:
            self.top_id = top
        recent = self._recent
        recent.append((first, ids))
        self._recent_total += 1
        self._recent_count += len(ids)
        while self._recent_count > window:
            start, oldest = recent[0]
            excess = self._recent_count - window
            if len(oldest) <= excess:
                recent.popleft()
                self._recent_count -= len(oldest)
            else:
                recent[0] = (start + excess, oldest[excess:])
                self._recent_count -= excess

    def position_of(self, msg_id: bytes) -> int | None:
        """The position of an already logged message with this id, if it is still remembered
        (the last ``dedup_window`` ids are; a few older ones may be too, until the index is
        rebuilt)."""
        if msg_id > self.top_id or not self._recent:
            return None
        index = self._index
        unindexed = self._recent_total - self._indexed_total
        if unindexed:
            recent = self._recent
            if unindexed >= len(recent) or len(index) + self._recent_count > 2 * self._dedup_window:
                # Rebuild: drop the forgotten ids the index still holds.
                index.clear()
                unindexed = len(recent)
            for first, ids in itertools.islice(recent, len(recent) - unindexed, None):
                index.update(zip(ids, range(first, first + len(ids)), strict=True))
            self._indexed_total = self._recent_total
        return index.get(msg_id)

    # -- appending (consumer thread) -------------------------------------------------------

    def append(self, ids: list[bytes], timestamps: list[int], attempts: list[int], bodies: list[bytes]) -> int:
        """Append one record of messages (not yet durable: call ``sync``). Returns its first position."""
        return self.append_columns(
            ids,
            _le_bytes(array("q", timestamps)),
            _le_bytes(array("H", attempts)),
            _le_bytes(array("I", map(len, bodies))),
            b"".join(bodies),
        )

    def append_columns(
        self, ids: list[bytes], timestamps: bytes, attempts: bytes, body_sizes: bytes, bodies: bytes
    ) -> int:
        """``append`` with the numeric columns already packed (little-endian int64, uint16, uint32)."""
        first = self.end
        count = len(ids)
        joined_ids = b"".join(ids)
        parts = [
            b"",
            _KEY_FIRST_POSITION,
            _varint(first),
            self._record_names,
            _KEY_IDS,
            _varint(len(joined_ids)),
            joined_ids,
            _KEY_BODIES,
            _varint(len(bodies)),
            bodies,
            _KEY_TIMESTAMPS,
            _varint(len(timestamps)),
            timestamps,
            _KEY_ATTEMPTS,
            _varint(len(attempts)),
            attempts,
            _KEY_BODY_SIZES,
            _varint(len(body_sizes)),
            body_sizes,
        ]
        length = 0
        crc = 0
        for part in parts:
            length += len(part)
            crc = zlib.crc32(part, crc)
        parts[0] = _RECORD_HEADER.pack(length, crc)
        with self._lock:
            segment = self._segments[-1] if self._segments else None
        if segment is None or (segment.size >= self.segment_bytes and segment.records):
            segment = self._new_segment(first)
        file = self._file
        assert file is not None  # open with the newest segment
        file.write(b"".join(parts))
        record = _Record(first, count, segment.size, length)
        with self._lock:
            segment.records.append(record)
            segment.size += _RECORD_HEADER.size + length
            self.end = first + count
        self._remember(ids, first)
        return first

    def _new_segment(self, first: int) -> _Segment:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        path = self.directory / f"{first:020d}{SEGMENT_SUFFIX}"
        self._file = open(path, "w+b")  # noqa: SIM115 - the open segment, closed by _new_segment or close
        self._file.write(SEGMENT_MAGIC)
        segment = _Segment(path, first, [], len(SEGMENT_MAGIC))
        with self._lock:
            self._segments.append(segment)
        self._dir_dirty = True
        return segment

    def sync(self) -> None:
        """Make every appended message durable, then publish the new ``synced_end``."""
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._dir_dirty:
            _fsync_dir(self.directory)
            self._dir_dirty = False
        with self._lock:
            self.synced_end = self.end

    # -- reading and deleting (driver thread) ----------------------------------------------

    def read(self, start: int, stop: int) -> Columns:
        """Messages [start, stop) as one chunk of columns; they must be synced and retained."""
        if start >= stop:
            return Columns()
        with self._lock:
            if stop > self.synced_end:
                raise WalError(
                    f"write-ahead log {self.directory} ends at position {self.synced_end}, "
                    f"Spark asked for [{start}, {stop})"
                )
            first_kept = self._segments[0].first if self._segments else self.synced_end
            if start < first_kept:
                raise WalError(
                    f"write-ahead log {self.directory} no longer holds positions [{start}, "
                    f"{first_kept}): they were deleted after a commit, Spark asked for [{start}, {stop})"
                )
            wanted = []
            for segment in self._segments:
                if segment.end <= start or segment.first >= stop:
                    continue
                for rec in segment.records:
                    if rec.first + rec.count <= start or rec.first >= stop:
                        continue
                    wanted.append((segment.path, rec))
        parts = []
        handles: dict[Path, int] = {}
        try:
            for path, rec in wanted:
                fd = handles.get(path)
                if fd is None:
                    fd = handles[path] = os.open(path, os.O_RDONLY)
                raw = os.pread(fd, rec.length, rec.offset + _RECORD_HEADER.size)
                cols = Columns.from_batch(wal_pb2.Batch.FromString(raw))
                lo = max(start, rec.first) - rec.first
                hi = min(stop, rec.first + rec.count) - rec.first
                parts.append(cols.slice(lo, hi))
        finally:
            for fd in handles.values():
                os.close(fd)
        return Columns.concat(parts) if parts else Columns()

    def _overlaps(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(first position, messages, bytes) of each record's part in [start, stop), in order; a
        record's bytes are shared evenly among its messages."""
        with self._lock:
            return [
                (lo, hi - lo, (hi - lo) * rec.length // rec.count)
                for segment in self._segments
                if segment.end > start and segment.first < stop
                for rec in segment.records
                if rec.first + rec.count > start and rec.first < stop
                for lo, hi in ((max(start, rec.first), min(stop, rec.first + rec.count)),)
            ]

    def bytes_between(self, start: int, stop: int) -> int:
        """About how many bytes of the log messages [start, stop) take; what ``read`` returns for
        them is about as large."""
        return sum(size for _, _, size in self._overlaps(start, stop))

    def position_within(self, start: int, stop: int, budget: int) -> int:
        """The end of the longest run of messages from ``start`` (at most to ``stop``) whose bytes
        (as ``bytes_between`` counts them) stay within ``budget``; at least one message when
        ``budget`` is positive, so that a message larger than the budget still goes."""
        position = start
        for first, count, size in self._overlaps(start, stop):
            if size > budget:
                position = first + count * budget // size
                break
            position = first + count
            budget -= size
        if budget > 0 and position == start < stop:
            position += 1
        return min(position, stop)

    def start_at(self, position: int) -> None:
        """Give an empty log its first position (its first segment will be named by it)."""
        with self._lock:
            if self._segments or self.end:
                raise WalError(f"write-ahead log {self.directory} is not empty: it cannot start at {position}")
            self.end = self.synced_end = position

    def first_retained(self) -> int:
        with self._lock:
            return self._segments[0].first if self._segments else self.synced_end

    def delete_before(self, position: int) -> int:
        """Delete the segments whose messages are all below ``position``; returns how many.
        The newest segment stays (appends continue in it)."""
        with self._lock:
            doomed = []
            while len(self._segments) > 1 and self._segments[0].end <= position:
                doomed.append(self._segments.pop(0))
        for segment in doomed:
            with contextlib.suppress(FileNotFoundError):
                segment.path.unlink()
        if doomed:
            _fsync_dir(self.directory)
        return len(doomed)

    def segment_count(self) -> int:
        with self._lock:
            return len(self._segments)

    def close(self) -> None:
        if self._file is not None:
            try:
                self.sync()
            finally:
                self._file.close()
                self._file = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def log_dirname(nsqd: str) -> str:
    return urllib.parse.quote(nsqd, safe="")


class WalDirectory:
    """The walPath: its lock, the logs of every nsqd, and the committed offset."""

    def __init__(
        self,
        path: str | Path,
        topic: str,
        channel: str,
        *,
        segment_bytes: int,
        dedup_window: int,
        lock_timeout: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.topic = topic
        self.channel = channel
        self.segment_bytes = segment_bytes
        self.dedup_window = dedup_window
        self.lock_timeout = lock_timeout
        self.logs: dict[str, MessageLog] = {}
        self._logs_lock = threading.Lock()
        self._lock_fd: int | None = None

    def open(self) -> WalDirectory:
        self.path.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            self._check_identity()
            for entry in sorted(self.path.iterdir()):
                if entry.is_dir():
                    nsqd = urllib.parse.unquote(entry.name)
                    self.logs[nsqd] = self._new_log(nsqd).open()
        except BaseException:
            self.close()
            raise
        return self

    def _acquire_lock(self) -> None:
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise WalLockedError(
                        f"walPath {self.path} is in use by another process (its LOCK is held); "
                        f"each streaming query needs its own walPath"
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _check_identity(self) -> None:
        """A walPath belongs to one topic/channel: reusing it for another would mix streams."""
        ident = self.path / "source.json"
        mine = {"topic": self.topic, "channel": self.channel}
        if ident.exists():
            theirs = json.loads(ident.read_text())
            if theirs != mine:
                raise WalError(
                    f"walPath {self.path} holds the log of topic {theirs.get('topic')!r} channel "
                    f"{theirs.get('channel')!r}, not {self.topic!r}/{self.channel!r}"
                )
        else:
            _atomic_write(ident, json.dumps(mine).encode())

    def _new_log(self, nsqd: str) -> MessageLog:
        return MessageLog(
            self.path / log_dirname(nsqd),
            nsqd,
            self.topic,
            self.channel,
            segment_bytes=self.segment_bytes,
            dedup_window=self.dedup_window,
        )

    def log_for(self, nsqd: str) -> MessageLog:
        with self._logs_lock:
            found = self.logs.get(nsqd)
            if found is None:
                found = self.logs[nsqd] = self._new_log(nsqd).open()
            return found

    def snapshot(self) -> dict[str, MessageLog]:
        with self._logs_lock:
            return dict(self.logs)

    def read_committed(self) -> dict | None:
        path = self.path / "committed.json"
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def write_committed(self, offset: dict) -> None:
        _atomic_write(self.path / "committed.json", json.dumps(offset, sort_keys=True).encode())

    def close(self) -> None:
        for mlog in self.snapshot().values():
            try:
                mlog.close()
            except OSError as exc:
                log.warning("closing write-ahead log %s: %s", mlog.directory, exc)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
