"""The offset-addressed log of a log channel (nsqd/LOG-PROTOCOL.md): segment files of checksummed chunks.

Files, in the data path, for the log named ``<topic>:<channel>``::

    <name>.log.00000000000000000000.dat   segments, named by their first offset (20 digits)
    <name>.log.meta                       {"committed": C}, replaced atomically at each commit, plus the
                                          takeovers the log took part in (``notes``, below)

A segment is chunks back to back, one per append: ``[uint32 length][uint32 crc32][uint64 first][uint32
count]`` then the messages' columns as LREAD sends them (``protocol.log.Columns``: timestamps, IDs, lengths,
attempts, bodies). ``length`` counts the 20-byte header too; ``crc32`` (zlib's) covers what follows it. Storing
the wire's columns means a read joins slices of chunks, column by column, and never takes a step per message;
the CRC and the offset continuity let the start-up scan find a torn or damaged chunk, which ends the log there
(see ``_load``): nothing after it is ever served.

In memory: per chunk its first offset, count, segment, position, length and newest timestamp (the index is
per append, so its size follows the number of writes, not of messages). Appends in non-durable mode gather in
``_pending`` and reach the file as one chunk per ``PENDING_MESSAGES`` / ``PENDING_BYTES``, at the daemon's
periodic sync (``sync_if_due``, the disk queue's interface: the log sits in the same ``active`` set), before a
read of them, and at close; in durable mode every append is written and fsynced before it returns, which is
what lets the topic release its own record of the messages (topic.py, durable mode).

Offsets: ``end`` is the offset the next message gets; ``committed`` everything below is finished; ``start`` the
oldest readable one: ``committed`` without retention, else the first offset of the oldest segment kept.
Segments wholly below ``committed`` are removed at once without retention, and by ``--log-retention-time`` /
``--log-retention-bytes`` otherwise; a segment holding an uncommitted offset is never removed.

Notes (replication, LOG-PROTOCOL.md "Replication"): ``adopted`` on a replica (the offsets at which a takeover
appended an origin's messages) and ``handed_over`` on an origin back after one (the offsets whose messages went to
the replica). They live in the meta file beside ``committed``, so they outlast restarts, and LOG answers them: a
reader tells by them a takeover from a loss. Each list keeps its last ``NOTES_KEPT`` entries.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import re
import struct
import time
import zlib

from protocol.log import Columns, encode_range

from .atomic_file import replace_file

__all__ = ["LogRangeError", "OffsetLog", "PENDING_BYTES", "PENDING_MESSAGES"]

_CHUNK = struct.Struct(">IIQI")
CHUNK_HEADER = _CHUNK.size  # 16
#: appends gathered in memory (non-durable mode) before they are written as one chunk
PENDING_MESSAGES = 4096
PENDING_BYTES = 1 << 20
#: a chunk holds at most this many messages (a large append is cut), so reading one offset reads little
CHUNK_MESSAGES = 8192
#: IDs of the log's last messages kept at opening: a message given again with one of them is not appended twice
#: (after a kill -9 in durable mode the topic copies again the batch whose release it had not yet recorded: at
#: most one drain batch, ``topic.DRAIN_BATCH``, since the topic records it right after a log took it)
RECENT_IDS = 4096
#: entries kept per note list (a takeover adds one; older ones describe offsets no running reader stands at)
NOTES_KEPT = 16
#: the notes a meta file may carry beside ``committed``
NOTE_KEYS = ("adopted", "handed_over")
_SEGMENT = re.compile(r"\.log\.(\d{20})\.dat\Z")


class LogRangeError(Exception):
    """A range or offset outside the log: ``kind`` is ``before_start``, ``past_end`` or ``bad_range``."""

    def __init__(self, kind: str, offset: int, bound: int) -> None:
        super().__init__(kind, offset, bound)
        self.kind = kind
        self.offset = offset
        self.bound = bound


class _Segment:
    __slots__ = ("first", "path", "fd", "size", "newest")

    def __init__(self, first: int, path: str, fd: int, size: int = 0) -> None:
        self.first = first
        self.path = path
        self.fd = fd
        self.size = size
        self.newest = 0  # newest message timestamp (ns) in the segment: time retention


class _Chunk:
    __slots__ = ("first", "count", "segment", "pos", "length", "newest")

    def __init__(self, first: int, count: int, segment: _Segment, pos: int, length: int, newest: int) -> None:
        self.first = first
        self.count = count
        self.segment = segment
        self.pos = pos
        self.length = length
        self.newest = newest


class OffsetLog:
    def __init__(
        self,
        data_path: str,
        name: str,
        *,
        max_bytes_per_file: int = 100 << 20,
        durable: bool = False,
        retention_time: float = 0.0,
        retention_bytes: int = 0,
        active: dict | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.data_path = data_path
        self.name = name
        self.max_bytes_per_file = max_bytes_per_file
        self.durable = durable
        self.retention_time = retention_time
        self.retention_bytes = retention_bytes
        self.log = logger or logging.getLogger("nsqd")
        self._active = active  # the daemon's set of queues owing a periodic sync
        self._prefix = os.path.join(data_path, f"{name}.log.")
        self.meta_path = self._prefix + "meta"
        self.committed = 0
        self.notes: dict[str, list[dict]] = {}  # NOTE_KEYS -> entries, oldest first (kept in the meta file)
        self.end = 0  # next offset to assign (pending appends included)
        self._segments: list[_Segment] = []
        self._chunks: list[_Chunk] = []
        self._firsts: list[int] = []  # chunk first offsets, for bisect
        self._newest_prefix: list[int] = []  # running max of chunk timestamps, for LSEEK's bisect
        self._written = 0  # end of what is in the files
        self._pending: list[Columns] = []
        self._pending_count = 0
        self._pending_bytes = 0
        self.owes_sync = False
        self._unsynced: set[int] = set()
        self.closed = False
        # the IDs of the last RECENT_IDS messages at opening, checked by ``append`` until as many more came
        self._recent: set[bytes] = set()
        self._recent_left = 0

    # -- opening ---------------------------------------------------------------------------------
    @staticmethod
    def exists(data_path: str, name: str, known_files: frozenset[str] | None = None) -> bool:
        meta = f"{name}.log.meta"
        if known_files is not None:
            return meta in known_files
        return os.path.exists(os.path.join(data_path, meta))

    def open(self) -> OffsetLog:
        """Read the meta file and scan the segments (creating the meta file of a new log)."""
        try:
            with open(self.meta_path, "rb") as f:
                meta = json.loads(f.read())
            self.committed = int(meta["committed"])
            self.notes = {key: meta[key] for key in NOTE_KEYS if isinstance(meta.get(key), list)}
        except FileNotFoundError:
            self._save_meta()
        except (ValueError, KeyError, TypeError) as exc:
            self.log.error(
                "LOG(%s): %s is unreadable (%s), committed offset taken as 0", self.name, self.meta_path, exc
            )
        self._load()
        return self

    def _segment_files(self) -> list[tuple[int, str]]:
        directory = self.data_path
        head = os.path.basename(self._prefix)
        found = []
        for entry in os.listdir(directory):
            if entry.startswith(head):
                m = _SEGMENT.search(entry)
                if m is not None and entry == f"{head}{m.group(1)}.dat":
                    found.append((int(m.group(1)), os.path.join(directory, entry)))
        found.sort()
        return found

    def _load(self) -> None:
        """Scan every segment: each chunk's header, CRC, offset continuity and columns. The first bad chunk
        ends the log: that file is cut there, the later ones are moved aside (``.bad``)."""
        files = self._segment_files()
        expected = None
        for index, (first, path) in enumerate(files):
            if expected is not None and first != expected:
                self._damaged(
                    files[index:], path, 0, f"segment starts at offset {first}, {expected} expected", expected
                )
                break
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            segment = _Segment(first, path, fd)
            self._segments.append(segment)
            offset = first
            data = _read_all(fd)
            pos = 0
            bad = None
            while pos < len(data):
                why = self._check_chunk(data, pos, offset)
                if isinstance(why, str):
                    bad = why
                    break
                count, length, newest = why
                self._add_chunk(_Chunk(offset, count, segment, pos, length, newest))
                offset += count
                pos += length
            segment.size = pos
            expected = offset
            if bad is not None:
                self._damaged(files[index + 1 :], path, pos, bad, offset)
                os.ftruncate(fd, pos)
                break
        self._written = self.end = expected if expected is not None else self.committed
        if self._chunks and self._chunks[0].first > self.committed:
            self.log.error(
                "LOG(%s): the files start at offset %d above the committed offset %d; the offsets between are lost",
                self.name,
                self._chunks[0].first,
                self.committed,
            )
            self.committed = self._chunks[0].first
            self._save_meta()
        if self.committed > self.end:
            # what the files held was lost up to the committed offset (a crash before the data reached the disk
            # outside durable mode, or damage): everything kept is committed; the log goes on from there
            if self._chunks:
                self.log.warning(
                    "LOG(%s): the files end at offset %d below the committed offset %d; the log goes on from %d",
                    self.name,
                    self.end,
                    self.committed,
                    self.committed,
                )
            for segment in list(self._segments):
                self._remove_segment(segment)
            self._written = self.end = self.committed
        self._drop_empty_tail()
        self.apply_retention()
        self._load_recent()

    def _load_recent(self) -> None:
        recent: list[bytes] = []
        for chunk in reversed(self._chunks):
            if len(recent) >= RECENT_IDS:
                break
            try:
                recent += self._chunk_columns(chunk).id_list()
            except OSError:
                break
        self._recent = set(recent)
        self._recent_left = 2 * RECENT_IDS if recent else 0

    def _drop_empty_tail(self) -> None:
        # an empty last segment (created, then killed before its first chunk) is removed: the next append makes a
        # new one named by the right offset
        while self._segments and self._segments[-1].size == 0:
            segment = self._segments.pop()
            os.close(segment.fd)
            _remove(segment.path, self.log)

    def _check_chunk(self, data: bytes, pos: int, offset: int):
        if len(data) - pos < CHUNK_HEADER:
            return f"{len(data) - pos} bytes, a chunk header is {CHUNK_HEADER}"
        length, crc, first, count = _CHUNK.unpack_from(data, pos)
        if length < CHUNK_HEADER or pos + length > len(data):
            return f"chunk length {length} with {len(data) - pos} bytes left in the file"
        if zlib.crc32(data[pos + 8 : pos + length]) != crc:
            return "checksum mismatch"
        if first != offset:
            return f"chunk of offset {first}, {offset} expected"
        try:
            columns = Columns.from_payload(data[pos + CHUNK_HEADER : pos + length], count)
        except (ValueError, struct.error) as exc:
            return str(exc)
        newest = max(columns.timestamp_list()) if count else 0
        return count, length, newest

    def _damaged(self, rest: list[tuple[int, str]], path: str, pos: int, why: str, offset: int) -> None:
        self.log.error(
            "LOG(%s): %s: bad chunk at byte %d (%s), the log ends at offset %d", self.name, path, pos, why, offset
        )
        for _, later in rest:
            try:
                os.replace(later, later + ".bad")
                self.log.error("LOG(%s): moved %s aside (%s.bad)", self.name, later, later)
            except OSError as exc:
                self.log.error("LOG(%s): failed to move %s aside - %s", self.name, later, exc)

    def _add_chunk(self, chunk: _Chunk) -> None:
        self._chunks.append(chunk)
        self._firsts.append(chunk.first)
        prefix = self._newest_prefix
        self._newest_prefix.append(max(prefix[-1], chunk.newest) if prefix else chunk.newest)
        if chunk.newest > chunk.segment.newest:
            chunk.segment.newest = chunk.newest

    # -- offsets ---------------------------------------------------------------------------------
    @property
    def retaining(self) -> bool:
        return self.retention_time > 0 or self.retention_bytes > 0

    @property
    def start(self) -> int:
        if self.retaining and self._chunks:
            return min(self._chunks[0].first, self.committed)
        return self.committed

    def depth(self) -> int:
        return self.end - self.committed

    def offsets(self) -> tuple[int, int, int]:
        return self.start, self.committed, self.end

    # -- appending -------------------------------------------------------------------------------
    def append(self, columns: Columns) -> int:
        """Give the messages the next offsets; returns the first. Durable: on disk and synced on return.
        OSError: nothing was appended (the files are as they were)."""
        if self.closed:
            raise OSError(f"log {self.name} is closed")
        if self._recent_left > 0:
            columns = self._without_recent(columns)
        first = self.end
        if not columns.count:
            return first
        if self.durable:
            self._pending.append(columns)
            self._pending_count += columns.count
            try:
                self._write_pending(sync=True)
            except OSError:
                self._pending.pop()
                self._pending_count -= columns.count
                raise
            self.end = self._written
            return first
        self._pending.append(columns)
        self._pending_count += columns.count
        self._pending_bytes += len(columns.bodies)
        self.end += columns.count
        if self._pending_count >= PENDING_MESSAGES or self._pending_bytes >= PENDING_BYTES:
            self._write_pending(sync=False)
        elif self._active is not None:
            self.owes_sync = True
            self._active[self] = None
        return first

    def _without_recent(self, columns: Columns) -> Columns:
        """``columns`` without the messages the log held at opening (see ``RECENT_IDS``)."""
        ids = columns.id_list()
        self._recent_left -= len(ids)
        recent = self._recent
        if self._recent_left <= 0:
            self._recent = set()
        if recent.isdisjoint(ids):
            return columns
        keep = [k for k, i in enumerate(ids) if i not in recent]
        self.log.info(
            "LOG(%s): %d message(s) given again after a restart were in the log already",
            self.name,
            len(ids) - len(keep),
        )
        stamps = columns.timestamp_list()
        attempts = struct.unpack(f">{columns.count}H", columns.attempts)
        starts = columns.body_starts()
        bodies = columns.bodies
        return Columns.from_messages(
            [ids[k] for k in keep],
            [stamps[k] for k in keep],
            [attempts[k] for k in keep],
            [bodies[starts[k] : starts[k + 1]] for k in keep],
        )

    def _write_pending(self, sync: bool) -> None:
        """Write what was appended and not yet written, as chunks of at most ``CHUNK_MESSAGES``."""
        pending = self._pending
        if not pending:
            if sync:
                self._sync()
            return
        merged = (
            Columns.from_payload(b"".join(Columns.join_payload(pending)), self._pending_count)
            if len(pending) > 1
            else pending[0]
        )
        offset = self._written
        written = []
        segment = None
        try:
            for i in range(0, merged.count, CHUNK_MESSAGES):
                part = merged.slice(i, min(i + CHUNK_MESSAGES, merged.count))
                body = b"".join(part.payload())
                head = struct.pack(">QI", offset, part.count)
                crc = zlib.crc32(body, zlib.crc32(head))
                length = CHUNK_HEADER + len(body)
                record = struct.pack(">II", length, crc) + head + body
                segment = self._segment_for_write(offset, length)
                _write_fully(segment.fd, record)
                newest = max(part.timestamp_list()) if part.count else 0
                chunk = _Chunk(offset, part.count, segment, segment.size, length, newest)
                segment.size += length
                self._add_chunk(chunk)
                written.append(chunk)
                self._unsynced.add(segment.fd)
                offset += part.count
            if sync:
                self._sync()
        except OSError:
            # what reached the file is cut off again: the log is as it was before this write
            for chunk in reversed(written):
                self._chunks.pop()
                self._firsts.pop()
                self._newest_prefix.pop()
                chunk.segment.size = chunk.pos
            if segment is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(segment.fd, segment.size)
            raise
        self._written = offset
        pending.clear()
        self._pending_count = 0
        self._pending_bytes = 0

    def _segment_for_write(self, offset: int, length: int) -> _Segment:
        """The segment a chunk of ``length`` bytes goes to: the last one while it stays within
        ``max_bytes_per_file`` (a chunk larger than that gets a segment of its own), else a new one."""
        segments = self._segments
        if segments and (segments[-1].size == 0 or segments[-1].size + length <= self.max_bytes_per_file):
            return segments[-1]
        path = f"{self._prefix}{offset:020d}.dat"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        segment = _Segment(offset, path, fd)
        segments.append(segment)
        if self.durable:
            _sync_directory(self.data_path)
        return segment

    def _sync(self) -> None:
        for fd in self._unsynced:
            os.fsync(fd)
        self._unsynced.clear()

    def flush(self, sync: bool = False) -> None:
        self._write_pending(sync)
        self.owes_sync = False

    def sync_if_due(self, now: float) -> None:
        """The daemon's periodic sync (the disk queues' interface): write and sync what was appended."""
        if not self.closed:
            self.flush(sync=True)
        if self.retention_time > 0:
            self.apply_retention()

    # -- reading ---------------------------------------------------------------------------------
    def _check_range(self, first: int, to: int) -> None:
        if first > to:
            raise LogRangeError("bad_range", first, to)
        if to > self.end:
            raise LogRangeError("past_end", to, self.end)
        if first < self.start:
            raise LogRangeError("before_start", first, self.start)

    def read(self, first: int, to: int, max_bytes: int) -> bytes:
        """The range frame data of ``[first, to)``, at most ``max_bytes`` of it but at least one message."""
        self._check_range(first, to)
        if to > self._written:
            self.flush()
        runs: list[Columns] = []
        budget = max_bytes - 24
        offset = first
        index = bisect.bisect_right(self._firsts, first) - 1
        while offset < to:
            chunk = self._chunks[index]
            columns = self._chunk_columns(chunk)
            i = offset - chunk.first
            j = min(to - chunk.first, chunk.count)
            fit = columns.fitting(i, budget)
            if fit < j:
                j = max(fit, i + 1) if not runs else fit
                if j > i:
                    runs.append(columns.slice(i, j))
                    offset += j - i
                break
            runs.append(columns.slice(i, j))
            budget -= columns.size(i, j)
            offset += j - i
            index += 1
        return encode_range(first, self.end, runs)

    def _chunk_columns(self, chunk: _Chunk) -> Columns:
        data = os.pread(chunk.segment.fd, chunk.length - CHUNK_HEADER, chunk.pos + CHUNK_HEADER)
        if len(data) != chunk.length - CHUNK_HEADER:
            raise OSError(f"{chunk.segment.path}: short read at byte {chunk.pos}")
        return Columns.from_payload(data, chunk.count)

    def seek(self, timestamp_ns: int) -> int:
        """The smallest offset in ``[start, end)`` whose timestamp is at or after ``timestamp_ns``, else ``end``."""
        self.flush()
        start = self.start
        index = bisect.bisect_left(self._newest_prefix, timestamp_ns)
        # chunks wholly below ``start`` (committed, kept in the active segment) are skipped
        index = max(index, bisect.bisect_right(self._firsts, start) - 1)
        while index < len(self._chunks):
            chunk = self._chunks[index]
            if chunk.newest >= timestamp_ns and chunk.first + chunk.count > start:
                stamps = self._chunk_columns(chunk).timestamp_list()
                for i in range(max(start - chunk.first, 0), chunk.count):
                    if stamps[i] >= timestamp_ns:
                        return chunk.first + i
            index += 1
        return self.end

    def ids_between(self, first: int, to: int) -> list[bytes]:
        """The message IDs at offsets ``[first, to)`` that are still in the files (for replication: a commit's
        FINs). Only the ID column of each chunk is read (the bodies are most of a chunk)."""
        ids: list[bytes] = []
        if to > self._written:
            self.flush()
        index = max(bisect.bisect_right(self._firsts, first) - 1, 0)
        while index < len(self._chunks) and self._chunks[index].first < to:
            chunk = self._chunks[index]
            i = max(first - chunk.first, 0)
            j = min(to - chunk.first, chunk.count)
            if j > i:
                # the columns start with the timestamps (8 bytes each), then the IDs (16 each)
                start = chunk.pos + CHUNK_HEADER + 8 * chunk.count + 16 * i
                data = os.pread(chunk.segment.fd, 16 * (j - i), start)
                if len(data) != 16 * (j - i):
                    raise OSError(f"{chunk.segment.path}: short read at byte {start}")
                ids.extend(data[k : k + 16] for k in range(0, len(data), 16))
            index += 1
        return ids

    # -- committing and retention ----------------------------------------------------------------
    def commit(self, offset: int, *, remove: bool = True) -> bool:
        """Everything below ``offset`` is finished; True if that moved ``committed``. OSError: not committed.
        ``remove=False`` leaves the files retention would remove to the caller's ``apply_retention`` (so that
        ``ids_between`` still reads the committed span first)."""
        if offset > self.end:
            raise LogRangeError("past_end", offset, self.end)
        if offset <= self.committed:
            return False
        if offset > self._written:
            self.flush(sync=True)  # the meta file never runs ahead of the data it counts
        elif self._unsynced:
            self._sync()
        previous = self.committed
        self.committed = offset
        try:
            self._save_meta()
        except OSError:
            self.committed = previous
            raise
        if remove:
            self.apply_retention()
        return True

    def _save_meta(self) -> None:
        replace_file(self.meta_path, json.dumps({"committed": self.committed, **self.notes}).encode())

    def add_note(self, key: str, entry: dict) -> None:
        """Append ``entry`` to the note list ``key`` (one of ``NOTE_KEYS``) and write the meta file. OSError: the
        note is kept in memory and written with the next commit."""
        kept = self.notes.setdefault(key, [])
        kept.append(entry)
        del kept[:-NOTES_KEPT]
        self._save_meta()

    def settle_adopted(self, node: str) -> bool:
        """Origin ``node`` came back and heard which of its messages were adopted here: its ``adopted`` entries
        are marked settled (it runs again, so a reader that finds it gone later must not take that for this
        takeover). True if one changed (the meta file is written then)."""
        changed = False
        for entry in self.notes.get("adopted", ()):
            if entry.get("node") == node and not entry.get("settled"):
                entry["settled"] = True
                changed = True
        if changed:
            self._save_meta()
        return changed

    def apply_retention(self, now_ns: int | None = None) -> int:
        """Remove the segments wholly below ``committed`` that retention does not keep; returns how many."""
        removable = []
        committed = self.committed
        segments = self._segments
        for k, segment in enumerate(segments):
            end = segments[k + 1].first if k + 1 < len(segments) else self._written
            if end > committed or (k + 1 == len(segments) and self._pending):
                break
            removable.append(segment)
        if not removable:
            return 0
        if self.retaining:
            keep_from = len(removable)
            if self.retention_time > 0:
                limit = (now_ns if now_ns is not None else time.time_ns()) - int(self.retention_time * 1e9)
                keep_from = next((k for k, s in enumerate(removable) if s.newest >= limit), len(removable))
                if self.retention_bytes <= 0:
                    removable = removable[:keep_from]
                    keep_from = len(removable)
            if self.retention_bytes > 0:
                total = sum(s.size for s in removable)
                by_bytes = 0
                while by_bytes < len(removable) and total > self.retention_bytes:
                    total -= removable[by_bytes].size
                    by_bytes += 1
                removable = removable[: max(by_bytes, keep_from) if self.retention_time > 0 else by_bytes]
        for segment in removable:
            self._remove_segment(segment)
        return len(removable)

    def _remove_segment(self, segment: _Segment) -> None:
        self._segments.remove(segment)
        drop = 0
        while drop < len(self._chunks) and self._chunks[drop].segment is segment:
            drop += 1
        del self._chunks[:drop]
        del self._firsts[:drop]
        del self._newest_prefix[:drop]
        self._unsynced.discard(segment.fd)
        os.close(segment.fd)
        _remove(segment.path, self.log)

    # -- end -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Write and sync what is pending, close the files (a graceful stop)."""
        if self.closed:
            return
        try:
            self.flush(sync=True)
        finally:
            self.closed = True
            for segment in self._segments:
                os.close(segment.fd)
            if self._active is not None:
                self._active.pop(self, None)

    def delete(self) -> None:
        """The channel is deleted: every file of the log goes."""
        self.closed = True
        if self._active is not None:
            self._active.pop(self, None)
        for segment in self._segments:
            os.close(segment.fd)
            _remove(segment.path, self.log)
        self._segments.clear()
        self._chunks.clear()
        _remove(self.meta_path, self.log)

    def __repr__(self) -> str:
        return f"OffsetLog({self.name} {self.start}/{self.committed}/{self.end})"


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0)
    return data


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str, log: logging.Logger) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("LOG: failed to remove %s - %s", path, exc)
