"""The read side of one disk queue segment file: its descriptor, the buffer records are parsed from, the read ahead.

``DiskQueue`` opens one ``SegmentReader`` per segment it reads and asks it for the records between its read
position and the end it knows (the writer's position in the write file, the file's size in a complete one).

Records are parsed from a buffer read from the file. While the page cache serves the file (a backlog written
recently, the usual case), the buffer is read inline, ``_READ_CHUNK`` bytes at least: microseconds, cheaper than
handing the read to a thread. Once an inline read of the file was slow and slept (``_SLOW_READ``: the disk served
it), the rest of the file is read ahead on a thread (``file_worker.ReadAhead``), ``_READ_AHEAD`` bytes at a time,
while the loop parses what the previous read brought: a backlog that is no longer cached no longer stalls the event
loop at every chunk, only where the consumers outrun the disk. A record cut by the end of a chunk is joined alone
(a copy of one record, not of the chunk), and the chunk stays in ``_ahead`` for the records after it. A draining
queue thus holds at most about two chunks (512 KiB) in memory.

The descriptor is closed only once no read ahead uses it: ``forget()`` and ``close()`` wait for the one in flight
(a positioned read of at most ``_READ_AHEAD`` bytes).
"""

from __future__ import annotations

import os
import resource
import struct
import time

from .checksums import SideFile, crc_of
from .file_worker import ReadAhead

__all__ = ["Damaged", "SegmentReader", "SplitRecords"]

_LENGTH = struct.Struct(">i")
_READ_CHUNK = 1 << 16  # bytes read inline from a segment when no read ahead has them
_READ_AHEAD = 1 << 18  # bytes read ahead on a thread while the records already read are parsed
# An inline read that took longer than this and slept was served by the disk, not the page cache.
_SLOW_READ = 0.001


class SplitRecords:
    """Records taken as the columns of the message layout (``nsqd.message``): each record's timestamp, attempts and
    ID (its 26-byte header) and the rest, the body, split while the record is parsed. Against whole records that
    are decoded afterwards, this saves a copy of every record and a call per record (``DiskQueue.read_split``)."""

    __slots__ = ("timestamps", "attempts", "ids", "bodies")

    #: the header every record starts with: timestamp (ns), attempts, 16-byte ID
    HEADER = struct.Struct(">QH16s")

    def __init__(self) -> None:
        self.timestamps: list[int] = []
        self.attempts: list[int] = []
        self.ids: list[bytes] = []
        self.bodies: list[bytes] = []

    def __len__(self) -> int:
        return len(self.bodies)


class Damaged:
    """A damaged record that the side file's entries let the reader step over (``checksums.py``): it starts at
    ``pos``, the next record at ``skip_to``; ``what`` says what was wrong; ``entry`` is its side file entry,
    ``(length, crc)``, which names the record lost."""

    __slots__ = ("pos", "skip_to", "what", "entry")

    def __init__(self, pos: int, skip_to: int, what: str, entry: tuple[int, int] | None = None) -> None:
        self.pos = pos
        self.skip_to = skip_to
        self.what = what
        self.entry = entry


class SegmentReader:
    """Records of one open segment file, read inline or ahead on a thread (see the module notes). With ``sums``
    (its side file, see ``checksums.py``) every record is checked against its entry before it is taken."""

    __slots__ = ("fd", "path", "name", "log", "sums", "_buf", "_base", "_prefetch", "_ahead", "_from_disk")

    def __init__(self, fd: int, path: str, name: str, log, sums: SideFile | None = None) -> None:
        self.fd = fd
        self.path = path
        self.name = name
        self.log = log
        self.sums = sums
        self._buf = b""  # bytes of the file from offset _base
        self._base = 0
        self._prefetch: ReadAhead | None = None  # the read running on a thread, for the bytes after those held
        self._ahead: tuple[int, bytes] | None = None  # bytes it brought that are not used yet: (offset, bytes)
        self._from_disk = False  # an inline read missed the page cache: read the rest ahead on a thread

    def take(
        self, records: list[bytes] | SplitRecords, pos: int, max_count: int, end: int, low: int, high: int
    ) -> tuple[int, str | Damaged | None]:
        """Append the records from ``pos`` to ``records`` until ``end`` or ``max_count`` records; lengths must lie
        in ``[low, high]`` (``low`` at least a header when ``records`` are split). Returns the position after the
        last record taken and a description of the corruption or read error that stopped it, or None; with a
        side file, a ``Damaged`` record stops it too (at that record's start), and the caller steps over it."""
        if self.sums is not None:
            return self._take_checked(records, pos, max_count, end, low, high)
        # two loops rather than one with a branch per record: a file without a side file (nsqd's) pays nothing
        buf = self._buf
        base = self._base
        unpack = _LENGTH.unpack_from
        count = len(records)
        split = type(records) is SplitRecords
        if split:
            unpack_header = SplitRecords.HEADER.unpack_from
            add_timestamp = records.timestamps.append
            add_attempts = records.attempts.append
            add_id = records.ids.append
            append = records.bodies.append
            header_end = 4 + SplitRecords.HEADER.size
        else:
            append = records.append
            header_end = 4
        problem: str | Damaged | None = None
        while count < max_count and pos < end:
            off = pos - base
            if off + 4 > len(buf):
                buf, base, problem = self._fill(buf, base, pos, 4, end)
                if problem:
                    break
                off = pos - base
            (size,) = unpack(buf, off)
            if size < low or size > high:
                problem = f"invalid record size {size}"
                break
            stop = off + 4 + size
            if stop > len(buf):
                buf, base, problem = self._fill(buf, base, pos, 4 + size, end)
                if problem:
                    break
                off = pos - base
                stop = off + 4 + size
            if split:
                timestamp, attempts, msg_id = unpack_header(buf, off + 4)
                add_timestamp(timestamp)
                add_attempts(attempts)
                add_id(msg_id)
            append(buf[off + header_end : stop])
            pos += 4 + size
            count += 1
        self._buf = buf
        self._base = base
        return pos, problem

    def _take_checked(
        self, records: list[bytes] | SplitRecords, pos: int, max_count: int, end: int, low: int, high: int
    ) -> tuple[int, str | Damaged | None]:
        """``take`` with every record checked against its side file entry: a length field or bytes that do not
        match their entry's are a ``Damaged`` record (its entry gives where the next one starts); a record with
        no entry is taken as ``take`` would, its length alone checked."""
        sums = self.sums
        buf = self._buf
        base = self._base
        unpack = _LENGTH.unpack_from
        count = len(records)
        split = type(records) is SplitRecords
        header_end = 4 + SplitRecords.HEADER.size if split else 4
        problem: str | Damaged | None = None
        index = sums.index
        while count < max_count and pos < end:
            try:
                entry = sums.entry(index)
            except OSError as exc:
                problem = f"read error in {sums.path}: {exc}"
                break
            off = pos - base
            if off + 4 > len(buf):
                buf, base, problem = self._fill(buf, base, pos, 4, end)
                if problem:
                    break
                off = pos - base
            (size,) = unpack(buf, off)
            if entry is None:
                if size < low or size > high:
                    problem = f"invalid record size {size}"
                    break
                length = size
            else:
                length, crc = entry
                if pos + 4 + length > end:
                    problem = f"record of {length} bytes cut short by the end of the file at {end}"
                    break
            stop = off + 4 + length
            if stop > len(buf):
                buf, base, problem = self._fill(buf, base, pos, 4 + length, end)
                if problem:
                    break
                off = pos - base
                stop = off + 4 + length
            if entry is not None:
                what = None
                if size != length:
                    what = f"size field {size}, the checksum file says {length}"
                elif crc_of(buf[off:stop]) != crc:
                    what = "checksum mismatch"
                elif length < low or length > high:
                    what = f"invalid record size {length}"
                if what is not None:
                    problem = Damaged(pos, pos + 4 + length, what, entry)
                    sums.index = index + 1
                    self._buf, self._base = buf, base
                    return pos, problem
            if split:
                timestamp, attempts, msg_id = SplitRecords.HEADER.unpack_from(buf, off + 4)
                records.timestamps.append(timestamp)
                records.attempts.append(attempts)
                records.ids.append(msg_id)
                records.bodies.append(buf[off + header_end : stop])
            else:
                records.append(buf[off + header_end : stop])
            pos += 4 + length
            index += 1
            count += 1
        sums.index = index
        self._buf = buf
        self._base = base
        return pos, problem

    def lost_at_end(self, pos: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        """The entries (``(length, crc)``) of the records the side file lists beyond the reader's position: what a
        segment cut short has lost. ``end``: the segment was still written when its reader took that as its end
        (the reader stopped at ``pos``): records appended after it are not counted (``SideFile.entries_from``)."""
        return self.sums.entries_from(self.sums.index, pos, end) if self.sums is not None else []

    def _fill(self, buf: bytes, base: int, pos: int, need: int, end: int) -> tuple[bytes, int, str | None]:
        """A buffer holding ``need`` bytes from ``pos``: returns it, the file offset it starts at (at most ``pos``)
        and a problem (a read error or a file cut short) or None. ``buf``, from offset ``base``, is the buffer in
        use; ``pos`` lies in it or at its end."""
        data = None
        ahead = self._ahead
        if ahead is not None and ahead[0] <= pos and pos + need <= ahead[0] + len(ahead[1]):
            self._ahead = None
            data_at, data = ahead
        pending = self._prefetch
        if data is None and pending is not None and pending.pos == base + len(buf) and base <= pos <= pending.pos:
            self._prefetch = None
            try:
                chunk = pending.result()
            except OSError as exc:
                return b"", pos, f"read error: {exc}"
            at = pending.pos
            held = at - pos  # bytes of the wanted range already in buf
            if need - held <= len(chunk):
                if held == 0:
                    data_at, data = at, chunk
                else:
                    data_at, data = pos, buf[pos - base :] + chunk[: need - held]
                    self._ahead = (at, chunk)
        if data is None:
            self.forget()
            want = min(max(need, _READ_CHUNK), end - pos)
            switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            started = time.perf_counter()
            try:
                data = os.pread(self.fd, want, pos)
            except OSError as exc:
                return b"", pos, f"read error: {exc}"
            if not self._from_disk and self._served_by_disk(started, switches):
                self._from_disk = True
                self.log.info(
                    "DISKQUEUE(%s): %s is read from the disk, reading ahead on a thread", self.name, self.path
                )
            if len(data) < need:
                return data, pos, f"short read: wanted {need} bytes, {len(data)} available"
            data_at = pos
        if self._from_disk and self._prefetch is None:
            ahead = self._ahead
            following = ahead[0] + len(ahead[1]) if ahead is not None else data_at + len(data)
            if following < end:
                self._prefetch = ReadAhead(self.fd, min(_READ_AHEAD, end - following), following)
        return data, data_at, None

    @staticmethod
    def _served_by_disk(started: float, switches: int) -> bool:
        """Whether the inline read begun at ``started`` (``perf_counter``) waited for the disk: it was slow, and
        the thread slept meanwhile (a read preempted by another process is slow too, but does not sleep)."""
        return (
            time.perf_counter() - started > _SLOW_READ
            and resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw != switches
        )

    def forget(self) -> None:
        """Drop what was read (the bytes may change: a failed write was cut back), after any read ahead ends."""
        self._buf = b""
        self._base = 0
        self._ahead = None
        pending, self._prefetch = self._prefetch, None
        if pending is not None:
            pending.wait()  # its thread may still use the descriptor

    def close(self) -> None:
        self.forget()
        os.close(self.fd)
        if self.sums is not None:
            self.sums.close()
