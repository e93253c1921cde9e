"""Record checksums of a disk queue segment, in a side file beside it: damage is found, never delivered.

Why a side file. A segment file holds nsqd's records, ``[int32 length][record]`` back to back, and nothing else:
a data directory moves between real nsqd and trionsq in both directions, so no byte can be added inside it (nsqd
would deliver it, or refuse the record by its length). The checksums therefore live in a file of their own per
segment, as the due times of deferred messages do (``deferred_index.py``)::

    <data-path>/<queue>.diskqueue.000000.dat        the segment, byte for byte nsqd's
    <data-path>/<queue>.diskqueue.000000.dat.crc    one 8-byte entry per record of it, in order

An entry is ``[uint32 length][uint32 CRC-32C]`` (big-endian): the record's length, and the CRC-32C (Castagnoli,
``google-crc32c``: the CPU's instruction where there is one) of the record as it lies in the segment, its 4-byte
length field included. Entry ``i`` describes record ``i``, so the entries alone give every record's offset: a
record whose length field was overwritten is found (its checksum fails) and skipped by the length its entry
gives, and reading goes on with the next record instead of giving up the rest of the file. A segment cut short
is found too: the entries that go past its end are the records it lost, and they are counted.

Written with the record. ``DiskQueue`` writes the entries of a put right after its records (one ``pwrite`` each,
in the same call: a record is never readable before its entry), and cuts the side file back with the segment when
a put fails. It is synced with the segment wherever the segment is: by the inline sync that must end before an
``OK`` (the group commit, ``--sync-every=1``: a second fsync, of 8 bytes a record), by the background syncs and
at close. So every record acknowledged after an fsync has its entry on disk. Entries of records not yet synced
may be lost by a power cut with them: such an entry reads as zeros or is missing, and an entry of length 0, or
none, means "no checksum" (the record is read as nsqd would, its length checked against the limits). A lost entry
thus costs detection for that record, never a false alarm.

Without a side file (a directory from real nsqd, or a queue written with checksums off) a segment is read as
before: lengths checked, the first bad one sets the rest of the file aside (``.bad``). Real nsqd ignores the side
files; a segment it appends to after trionsq wrote it gets records without entries, read unchecked.
"""

from __future__ import annotations

import os
import struct

import google_crc32c

__all__ = ["ENTRY", "LostRecords", "SideFile", "crc_of", "entries_of", "side_file_name"]

#: one entry: the record's length, the CRC-32C of its length field and its bytes
ENTRY = struct.Struct(">II")
_LENGTH = struct.Struct(">i")
#: the start of a message record as framed in a segment: length field, timestamp, attempts (``nsqd.message``)
_MESSAGE_START = struct.Struct(">iqH")
#: attempts tried beyond a message's known count when matching it against a lost record (``LostRecords.claim``)
_ATTEMPTS_SLACK = 16
_value = google_crc32c.value
_extend = google_crc32c.extend
#: entries read from a side file at once while reading its segment
_READ_ENTRIES = 8192


def side_file_name(segment_path: str) -> str:
    return segment_path + ".crc"


def crc_of(framed: bytes) -> int:
    """CRC-32C of a record as framed in a segment (length field and bytes)."""
    return _value(framed)


#: CRC-32C of a length field, by length: records of a queue mostly share a few lengths, so a put computes the
#: CRC of its records' bytes only (a third less time per record than computing the length field's each time)
_length_crcs: dict[int, int] = {}


def _length_crc(length: int) -> int:
    if len(_length_crcs) >= 4096:
        _length_crcs.clear()
    crc = _length_crcs[length] = _value(_LENGTH.pack(length))
    return crc


def entries_of(records: list[bytes]) -> bytes:
    """The side file entries of ``records`` (unframed), in order."""
    pack, known = ENTRY.pack, _length_crcs.get
    # a cached CRC of 0 reads as missing and is computed again: still right
    return b"".join([pack(len(r), _extend(known(len(r)) or _length_crc(len(r)), r)) for r in records])


class SideFile:
    """The entries of one segment's side file, read as the segment is read (its writer may still add some)."""

    __slots__ = ("fd", "path", "index", "_buf", "_base")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.index = 0  # the entry of the record at the reader's position
        self._buf = b""  # entries from number _base on
        self._base = 0

    @classmethod
    def open(cls, segment_path: str) -> SideFile | None:
        path = side_file_name(segment_path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        return cls(fd, path)

    def entry(self, index: int) -> tuple[int, int] | None:
        """``(length, crc)`` of record ``index``, or None when the side file has no entry for it (or a zero one)."""
        off = (index - self._base) * 8
        if off < 0 or off + 8 > len(self._buf):
            self._buf = os.pread(self.fd, _READ_ENTRIES * 8, index * 8)
            self._base = index
            off = 0
            if len(self._buf) < 8:
                return None
        length, crc = ENTRY.unpack_from(self._buf, off)
        return (length, crc) if length else None

    def seek(self, pos: int) -> bool:
        """Point ``index`` at the record that starts at byte ``pos`` of the segment (a reader resuming there);
        False when no record starts there by the entries (they do not describe this segment: unchecked)."""
        index, at = 0, 0
        while at < pos:
            found = self.entry(index)
            if found is None:
                return False
            at += 4 + found[0]
            index += 1
        self.index = index
        return at == pos

    def count_from(self, index: int) -> int:
        """Entries from ``index`` to the end of the side file: records the segment should still hold there."""
        return len(self.entries_from(index))

    def entries_from(self, index: int, pos: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        """``(length, crc)`` of the records ``count_from`` counts (what a reader finds lost, named for whoever
        can get them back). With ``end``, only those that start before byte ``end`` (record ``index`` starts at
        ``pos``): a file still being written gets entries for records appended after a reader took ``end`` as
        its end, and those are not lost. An entry missing there leaves the offsets unknown: the count stops."""
        try:
            size = os.fstat(self.fd).st_size
        except OSError:
            return []
        found = []
        for i in range(index, size // 8):
            entry = self.entry(i)
            if end is not None:
                if entry is None or pos >= end:
                    break
                pos += 4 + entry[0]
            if entry is not None:
                found.append(entry)
        return found

    def close(self) -> None:
        os.close(self.fd)


class LostRecords:
    """The records a queue found damaged or lost, by their side file entries: which messages they were is gone
    with them, but an entry is a fingerprint of its record, so a copy of a message got from elsewhere (a replica)
    can be told to be one of them (``claim``) or not. ``unknown``: records were lost without an entry (a file
    missing with its side file, a file nsqd wrote, a depth found short): which is not known.

    An entry claimed once is never added again (a backfill reading the same damage again finds it again)."""

    __slots__ = ("entries", "unknown", "claimed", "_lengths")

    def __init__(self) -> None:
        self.entries: set[tuple[int, int]] = set()
        self.unknown = False
        self.claimed: set[tuple[int, int]] = set()
        self._lengths: dict[int, int] = {}  # length -> entries of that length: most copies fail on it alone

    def __bool__(self) -> bool:
        return bool(self.entries) or self.unknown

    def add(self, entries: list[tuple[int, int]] | set[tuple[int, int]] | None) -> None:
        """Records lost: their entries, or None when they are not known."""
        if entries is None:
            self.unknown = True
            return
        lengths = self._lengths
        for entry in entries:
            if entry not in self.claimed and entry not in self.entries:
                self.entries.add(entry)
                lengths[entry[0]] = lengths.get(entry[0], 0) + 1

    def merge(self, other: LostRecords) -> None:
        self.add(other.entries)
        self.unknown |= other.unknown

    def claim(self, msg_id: bytes, timestamp: int, attempts: int, body: bytes) -> bool:
        """Whether this message, as a record of the queue, is one of the records lost (its entry is then claimed).
        The record holds the attempts the queue wrote it with, which a copy from elsewhere may not know exactly:
        ``attempts`` and the counts up to ``_ATTEMPTS_SLACK`` beyond it (and from 0) are tried."""
        length = 26 + len(body)
        if length not in self._lengths:
            return False
        entries = self.entries
        tail = msg_id + body
        for count in dict.fromkeys((attempts, *range(0, min(attempts + _ATTEMPTS_SLACK, 0xFFFF) + 1))):
            entry = (length, _extend(_value(_MESSAGE_START.pack(length, timestamp, count)), tail))
            if entry in entries:
                entries.discard(entry)
                self.claimed.add(entry)
                left = self._lengths.pop(length) - 1
                if left:
                    self._lengths[length] = left
                return True
        return False
