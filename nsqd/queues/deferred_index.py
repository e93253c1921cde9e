"""The deferred index: when a deferred message that sits in a disk queue is due, kept beside the queue.

nsqd's disk record is the wire encoding of a message (timestamp, attempts, ID, body); it has no field for a delay,
so nsqd delivers a deferred message as soon as it comes back from disk, whatever time was left. This module keeps
the delay without touching that format. Each disk queue may have one small side file::

    <data-path>/<queue name>.deferred.dat        (a topic "T": T.deferred.dat; a channel "T:C": T:C.deferred.dat)

listing ``(message ID, due time)`` pairs for deferred messages stored in that queue. The queue's own files are
byte for byte what nsqd writes, so a data directory still moves between trionsq and nsqd in both directions: nsqd
never opens the side file (its deferred messages are then delivered at once, as nsqd always does), and trionsq
reads a directory without side files exactly as nsqd would.

Why a side file rather than a record format of our own: any change inside the records (a marker in the body, an
extra header) would be delivered to consumers by a real nsqd reading the directory, or refused by its length
checks. The side file costs nothing per ordinary message; it is written only at a clean shutdown (and, in durable
mode, its entries live in memory while the process runs).

When a message comes off the disk queue, its ID is looked up (only while the index is not empty): a hit gives the
due time back and the message goes to the deferred heap instead of the ready queue. Due times are wall-clock
nanoseconds (``time.time_ns()``) because they must survive a restart; a due time already past means "deliver now".

Stale entries. The file also records the queue's write position at the moment it was saved: every listed message
lies before that position. Entries loaded from the file are dropped as soon as the queue's read position passes it,
so IDs that are no longer in the queue (another daemon consumed them, or the queue was emptied) cannot linger.
Entries added while running (durable mode) are removed when their message is read.

Format (all integers big-endian)::

    magic        8 bytes  b"TNSQDEF1"
    end          2 x int64: file number and byte position of the queue's writer when the file was saved
    count        uint32
    entries      count x (16-byte message ID, int64 due time in ns since the Unix epoch)
    checksum     uint32 CRC-32 of everything before it

It is replaced atomically (``<file>.<random>.tmp``, fsync, rename). A file that is damaged (bad magic, short, wrong
checksum) is logged and ignored: the messages are then delivered without their delay, never lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Container, Sequence

from .atomic_file import replace_file

__all__ = ["DeferredIndex", "side_file_name"]

MAGIC = b"TNSQDEF1"
_HEAD = struct.Struct(">8sqqI")
_ENTRY = struct.Struct(">16sq")
_CRC = struct.Struct(">I")

_default_log = logging.getLogger("nsqd")


def side_file_name(data_path: str, queue_name: str) -> str:
    return os.path.join(data_path, f"{queue_name}.deferred.dat")


class DeferredIndex:
    """``message ID -> due wall-clock ns`` for deferred messages stored in one disk queue."""

    __slots__ = ("path", "due", "log", "_loaded", "_loaded_end")

    def __init__(self, data_path: str, queue_name: str, logger: logging.Logger | None = None) -> None:
        self.path = side_file_name(data_path, queue_name)
        self.due: dict[bytes, int] = {}
        self.log = logger if logger is not None else _default_log
        # IDs that came from the file (subject to the stale-entry rule); an immutable empty one until then
        self._loaded: list[bytes] | tuple = ()
        self._loaded_end: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.due)

    def __bool__(self) -> bool:
        return bool(self.due)

    # -- running ---------------------------------------------------------------------------------
    def add(self, msg_id: bytes, due_ns: int) -> None:
        self.due[msg_id] = due_ns

    def take(self, msg_id: bytes) -> int | None:
        """The due time of ``msg_id`` if it is listed (the entry is removed), else None."""
        return self.due.pop(msg_id, None)

    def reader_moved(self, read_position: tuple[int, int]) -> None:
        """Drop the entries loaded from the file once the queue's reader is at or past the saved end."""
        end = self._loaded_end
        if end is None or read_position < end:
            return
        due = self.due
        stale = sum(1 for msg_id in self._loaded if due.pop(msg_id, None) is not None)
        if stale:
            self.log.warning(
                "DEFERRED(%s): %d deferred entr%s matched no message in the queue, dropped",
                os.path.basename(self.path),
                stale,
                "y" if stale == 1 else "ies",
            )
        self._loaded = ()
        self._loaded_end = None

    def clear(self) -> None:
        self.due.clear()
        self._loaded = ()
        self._loaded_end = None

    # -- the file --------------------------------------------------------------------------------
    def load(self, read_position: tuple[int, int], known_files: Container[str] | None = None) -> int:
        """Read the side file if there is one; returns the number of entries loaded. The file stays in place
        until the next ``save`` or ``remove_file`` (so a crash before then still finds it). ``known_files``: the
        names of the files the directory held at start-up (``DiskQueue``'s); without the side file's among them,
        nothing is opened."""
        if known_files is not None and os.path.basename(self.path) not in known_files:
            return 0
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            self.log.error(
                "DEFERRED(%s): cannot read - %s; deferred messages will be delivered at once", self.path, exc
            )
            return 0
        entries = decode(data)
        if entries is None:
            self.log.error("DEFERRED(%s): damaged file ignored; deferred messages will be delivered at once", self.path)
            return 0
        end, pairs = entries
        if read_position >= end:
            return 0  # every listed message was read already (by another process): nothing to restore
        for msg_id, due_ns in pairs:
            self.due[msg_id] = due_ns
        self._loaded = [msg_id for msg_id, _ in pairs]
        self._loaded_end = end
        self.log.info("DEFERRED(%s): %d deferred message(s) restored", os.path.basename(self.path), len(pairs))
        return len(pairs)

    def save(self, end_position: tuple[int, int], extra: Sequence[tuple[bytes, int]] = ()) -> None:
        """Write every entry (plus ``extra``) with the queue's current write position; no entries, no file."""
        pairs = list(self.due.items())
        pairs.extend(extra)
        if not pairs:
            self.remove_file()
            return
        data = encode(end_position, pairs)
        replace_file(self.path, data)

    def remove_file(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def encode(end_position: tuple[int, int], pairs: list[tuple[bytes, int]]) -> bytes:
    parts = [_HEAD.pack(MAGIC, end_position[0], end_position[1], len(pairs))]
    pack = _ENTRY.pack
    parts.extend(pack(msg_id, due_ns) for msg_id, due_ns in pairs)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> tuple[tuple[int, int], list[tuple[bytes, int]]] | None:
    """``(end position, [(id, due ns)])``, or None when the bytes are not a whole, intact side file."""
    if len(data) < _HEAD.size + _CRC.size:
        return None
    magic, end_file, end_pos, count = _HEAD.unpack_from(data)
    if magic != MAGIC or len(data) != _HEAD.size + count * _ENTRY.size + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc != zlib.crc32(data[: -_CRC.size]):
        return None
    pairs = [_ENTRY.unpack_from(data, _HEAD.size + i * _ENTRY.size) for i in range(count)]
    return (end_file, end_pos), pairs
