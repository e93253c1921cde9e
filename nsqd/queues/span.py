"""QueueSpan: the records of a disk queue between two positions, read from its files without moving its reader.

A backfill (``replication/snapshot.py``), the messages an origin keeps when a replica adopted others
(``replication/adopted.py``) and a replica sending copies back to a damaged origin (``replication/store.py``)
read a queue's records from its files while the queue goes on. They read them as the queue itself would: through
a ``SegmentReader`` with the segment's side file of checksums (``checksums.py``), so a damaged record is never
handed on as good data, wherever it is read.

The files are opened when the span is made (``QueueSpan(queue)``: from the queue's read position, or ``start``,
to its write position): a file the queue reads and removes meanwhile stays readable through its descriptor, and
records appended later are not part of the span. What the span finds wrong is counted, not raised:

- a damaged record (its checksum or length fails its entry) is skipped by its entry's length: ``damaged`` + 1;
- a file cut short: the entries its side file lists past its end are ``damaged``;
- a file missing (deleted, or set aside as ``.bad``): the records its side file lists, when the side file is left;
- a record that fails without a side file to step over it (a file nsqd wrote) ends that file: the rest of it
  cannot be trusted, as the queue would rename it ``.bad``.

``found`` is True after any of these, counted or not (a missing file without a side file loses an unknown number
of records): whoever reads the span knows that its view of the queue has a hole.
"""

from __future__ import annotations

import logging
import os

from .checksums import LostRecords, SideFile
from .segment_reader import Damaged, SegmentReader, SplitRecords

__all__ = ["QueueSpan"]

_default_log = logging.getLogger("nsqd")


class QueueSpan:
    """The records of ``queue`` from ``start`` (default: its read position) to its write position, as they are
    when this is made; see the module notes. ``close()`` releases the files (``records`` does at its end)."""

    def __init__(self, queue, start: tuple[int, int] | None = None, log: logging.Logger | None = None) -> None:
        self.name = queue.name
        self.log = log or _default_log
        self.damaged = 0  # records found damaged or lost
        self.found = False  # anything found wrong, counted or not
        #: the side file entries ``(length, crc)`` of the records found damaged or lost, and whether some were lost
        #: without one (a file missing with its side file, a file nsqd wrote): ``LostRecords``
        self.lost = LostRecords()
        #: (path, reader or None when the file is missing, start, end)
        self.files: list[tuple[str, SegmentReader | None, int, int]] = []
        self._low, self._high = queue.min_msg_size, queue.max_msg_size
        read_num, read_pos = start if start is not None else queue.read_position()
        write_num, write_pos = queue.write_position()
        #: the file written to at the capture: records appended to it later are not part of the span
        self._live = queue.file_name(write_num)
        checked = getattr(queue, "checksums", False)
        try:
            for num in range(read_num, write_num + 1):
                path = queue.file_name(num)
                begin = read_pos if num == read_num else 0
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    if num < write_num or write_pos > begin:  # a write file not begun yet is no loss
                        self.files.append((path, None, begin, 0))
                    continue
                end = write_pos if num == write_num else os.fstat(fd).st_size
                sums = SideFile.open(path) if checked else None
                if sums is not None and begin and not sums.seek(begin):
                    sums.close()  # the entries do not describe this file from there: read it unchecked
                    sums = None
                self.files.append((path, SegmentReader(fd, path, self.name, self.log, sums), begin, end))
        except BaseException:
            self.close()
            raise

    def _lost(self, entries: list[tuple[int, int]] | None) -> None:
        """Records lost: their side file entries, or None when how many and which is not known."""
        self.found = True
        self.lost.add(entries)
        if entries:
            self.damaged += len(entries)

    def _missing(self, path: str, start: int) -> None:
        sums = SideFile.open(path)
        lost = None
        if sums is not None:
            try:
                if not start or sums.seek(start):
                    lost = sums.entries_from(sums.index)
            finally:
                sums.close()
        self.log.error(
            "DISKQUEUE(%s): %s is missing: %s record(s) lost",
            self.name,
            path,
            len(lost) if lost is not None else "an unknown number of",
        )
        self._lost(lost)

    def records(self, batch: int, *, split: bool = True):
        """The span's records, ``SplitRecords`` of at most ``batch`` each (whole records in lists without
        ``split``; a generator, the files are closed at its end). Reads what the page cache holds inline, as the queue's
        own reader does (``segment_reader.py``)."""
        try:
            files = self.files
            for index, (path, reader, pos, end) in enumerate(files):
                self.files = files[index:]  # what ``close`` still closes if the reading stops here
                if reader is None:
                    self._missing(path, pos)
                    continue
                while pos < end:
                    out: SplitRecords | list[bytes] = SplitRecords() if split else []
                    pos, problem = reader.take(out, pos, batch, end, self._low, self._high)
                    if out:
                        yield out
                    if type(problem) is Damaged:
                        self.log.error(
                            "DISKQUEUE(%s): damaged record at byte %d of %s (%s), skipped",
                            self.name,
                            problem.pos,
                            path,
                            problem.what,
                        )
                        self._lost([problem.entry] if problem.entry is not None else None)
                        pos = problem.skip_to
                    elif problem is not None:
                        self.log.error(
                            "DISKQUEUE(%s): %s at %d of %s: the rest of that file cannot be read",
                            self.name,
                            problem,
                            pos,
                            path,
                        )
                        # with a side file, the records it lists from there on are counted below
                        self._lost(None if reader.sums is None else [])
                        break
                lost = reader.lost_at_end(pos, end if path == self._live else None)
                if lost:
                    self.log.error(
                        "DISKQUEUE(%s): %s ends at %d but its checksums list %d more record(s): lost",
                        self.name,
                        path,
                        pos,
                        len(lost),
                    )
                    self._lost(lost)
                reader.close()
                self.files = files[index + 1 :]
        finally:
            self.close()

    def close(self) -> None:
        for _num, reader, _start, _end in self.files:
            if reader is not None:
                reader.close()
        self.files = []
