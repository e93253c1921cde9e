"""nsq_to_file's files: names, revisions, rotation, gzip, fsync, the move from the work dir, and when a message
may be FIN'd. No trio and no sockets here; the clocks are parameters, so every rule is testable alone.

Names (NSQ 1.3.0's ``computeFilenameFormat``). ``--filename-format`` (default
``<TOPIC>.<HOST><REV>.<DATETIME>.log``) has ``<TOPIC>``, ``<HOST>`` (``--host-identifier``, in which
``<SHORT_HOST>`` and ``<HOSTNAME>`` are replaced, else the hostname up to its first dot) and ``<PID>`` replaced once
per topic; ``<DATETIME>`` (``--datetime-format``, see ``strftime``) each time a file is opened; ``--gzip`` appends
``.gz`` unless the name ends with it. ``<REV>`` is a revision, ``-000000``, ``-000001``...: when gzip, a size or
interval rotation or a separate work dir is on, the format must contain it (else the topic is not logged:
"missing <REV> ..."), and otherwise it is removed, because every start then appends to the one file of the hour.

Opening (``FileLogger.update_file``). A file is opened when the first message comes or at the first sync tick, and
again when it must rotate: its ``<DATETIME>`` changed (the revision restarts at 0), ``--rotate-interval`` passed
since it was opened, or more than ``--rotate-size`` bytes (uncompressed) were written to it; the size check happens
before a message is written, so the message that crosses the limit still goes to the old file. A rotation of the
same name takes the next revision. A revision is skipped when its name already exists in the output dir (work dir
apart) or, for gzip and interval rotation (opened with ``O_EXCL``), in the work dir; the others append (``O_APPEND``)
and skip a file already past ``--rotate-size``.

Closing (``FileLogger.close``): end the gzip stream, fsync, close, then, with a work dir, move the file to the same
name under the output dir without ever replacing a file there (a hard link, then unlink of the source; on a clash
the next free revision).

Gzip: each sync ends the current gzip member and starts another, so what was FIN'd is always a complete, checked
member, and a killed process leaves a file whose complete members ``gzip -d`` still reads. A file is therefore a
concatenation of members (the last one may be empty), as NSQ writes it.

Acknowledgement (``TopicWriter``): each message is written as its body and ``\\n`` (a body ending in a newline gets a
second one, as in NSQ) and kept pending. Pending messages are handed back for FIN only after an fsync covered them:
when the sync interval ticks, when ``--max-in-flight`` of them are pending, when the consumer is starved (holding
most of its RDY, so nsqd sends nothing more until some are FIN'd), when the file rotated, and when the tool stops.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.flags import format_duration

__all__ = [
    "DEFAULT_DATETIME_FORMAT",
    "DEFAULT_FILENAME_FORMAT",
    "FileError",
    "FileLogger",
    "FileOptions",
    "TopicWriter",
    "compute_filename_format",
    "strftime",
]

DEFAULT_FILENAME_FORMAT = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
DEFAULT_DATETIME_FORMAT = "%Y-%m-%d_%H"

# log levels as NSQ names them (runtime.logfmt maps them to logging's)
DEBUG, INFO, WARN, ERROR, FATAL = 10, 20, 30, 40, 50

LogFunc = Callable[[int, str], None]


class FileError(Exception):
    """A file operation failed; NSQ logs it as FATAL and exits 1. The text is NSQ's line without the level."""


@dataclass
class FileOptions:
    """The flags that shape the files (NSQ's Options, the file half)."""

    output_dir: str = "/tmp"
    work_dir: str = "/tmp"
    datetime_format: str = DEFAULT_DATETIME_FORMAT
    filename_format: str = DEFAULT_FILENAME_FORMAT
    host_identifier: str = ""
    gzip: bool = False
    gzip_level: int = 6
    skip_empty_files: bool = False
    rotate_size: int = 0
    rotate_interval: float = 0.0  # seconds
    max_in_flight: int = 200
    channel: str = "nsq_to_file"

    @property
    def separate_work_dir(self) -> bool:
        return self.work_dir != self.output_dir


# --- <DATETIME> -----------------------------------------------------------------------------------------------------

_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _numeric_zone(offset: int) -> str:
    sign = "-" if offset < 0 else "+"
    minutes = abs(offset) // 60
    return f"{sign}{minutes // 60:02d}{minutes % 60:02d}"


def _zone_name(t: time.struct_time) -> str:
    # Go prints the zone's abbreviation, or the numeric offset for a zone without one
    zone = t.tm_zone or ""
    return zone if zone.isalpha() else _numeric_zone(t.tm_gmtoff or 0)


# NSQ's strftime codes (its table of Go layout pieces), each as a function of the time
_CODES: dict[str, Callable[[time.struct_time], str]] = {
    "Y": lambda t: f"{t.tm_year:04d}",
    "y": lambda t: f"{t.tm_year % 100:02d}",
    "m": lambda t: f"{t.tm_mon:02d}",
    "B": lambda t: _MONTHS[t.tm_mon - 1],
    "b": lambda t: _MONTHS[t.tm_mon - 1][:3],
    "d": lambda t: f"{t.tm_mday:02d}",
    "A": lambda t: _DAYS[t.tm_wday],
    "a": lambda t: _DAYS[t.tm_wday][:3],
    "H": lambda t: f"{t.tm_hour:02d}",
    "I": lambda t: f"{(t.tm_hour % 12) or 12:02d}",
    "M": lambda t: f"{t.tm_min:02d}",
    "S": lambda t: f"{t.tm_sec:02d}",
    "p": lambda t: "PM" if t.tm_hour >= 12 else "AM",
    "z": lambda t: _numeric_zone(t.tm_gmtoff or 0),
    "Z": _zone_name,
    "%": lambda t: "%",
}


def strftime(format: str, t: time.struct_time) -> str:
    """``--datetime-format`` as NSQ expands it: the codes of its strftime (``%Y %y %m %B %b %d %A %a %H %I %M %S
    %p %Z %z %%``), English names whatever the locale; any other ``%x`` is kept as written.

    NSQ turns the format into a Go time layout, so literal text that happens to read as a layout token (a digit,
    ``Jan``, ``Mon``, ``PM``...) comes out as a date piece there; here literal text stays literal.
    """
    out: list[str] = []
    i, n = 0, len(format)
    while i < n:
        ch = format[i]
        if ch == "%" and i + 1 < n and format[i + 1] in _CODES:
            out.append(_CODES[format[i + 1]](t))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


# --- the name of a topic's files -------------------------------------------------------------------------------------


def compute_filename_format(
    opts: FileOptions, topic: str, *, hostname: str | None = None, pid: int | None = None
) -> str:
    """The topic's file name with everything but ``<DATETIME>`` and ``<REV>`` replaced; ``ValueError`` when the
    format lacks the ``<REV>`` that gzip, rotation or a work dir need."""
    if hostname is None:
        hostname = socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)
    name = opts.filename_format
    if opts.gzip or opts.rotate_size > 0 or opts.rotate_interval > 0 or opts.separate_work_dir:
        if "<REV>" not in name:
            raise ValueError("missing <REV> in --filename-format when gzip, rotation, or work dir enabled")
    else:
        name = name.replace("<REV>", "")
    name = name.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    name = name.replace("<PID>", str(os.getpid() if pid is None else pid))
    if opts.gzip and not name.endswith(".gz"):
        name += ".gz"
    return name


def _rev(number: int) -> str:
    return f"-{number:06d}"


def _make_parent(path: str) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, 0o770, exist_ok=True)


def _exclusive_rename(src: str, dst: str) -> None:
    """Rename that never replaces ``dst`` (``FileExistsError`` when it exists)."""
    os.link(src, dst)
    os.remove(src)


# --- one topic's current file ---------------------------------------------------------------------------------------


class FileLogger:
    """The file one topic is writing, and its rotation (see the module notes).

    ``wall_clock`` (Unix seconds) names the files, ``monotonic`` times ``--rotate-interval``; ``log(level, text)``
    gets NSQ's lines, already prefixed with ``[topic/channel]``. Failures raise ``FileError``.
    """

    def __init__(
        self,
        opts: FileOptions,
        topic: str,
        name_format: str,
        log: LogFunc,
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.opts = opts
        self.topic = topic
        self.name_format = name_format
        self._log_func = log
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._tag = f"[{topic}/{opts.channel}]"
        self.filename = ""  # the current name, <REV> unreplaced
        self.rev = 0
        self.path: str | None = None  # the open file's path (in the work dir)
        self.relative: str = ""  # that path's name relative to the work dir (the same under the output dir)
        self.filesize = 0  # bytes written to the file (uncompressed for gzip), from its size when opened
        self.open_time = 0.0
        self._file: Any = None
        self._gzip: Any = None  # the current gzip member's compressor
        self.files_closed: list[str] = []  # where each closed file ended up (for the tests and the log)

    def _log(self, level: int, text: str) -> None:
        self._log_func(level, f"{self._tag} {text}")

    def _fatal(self, text: str) -> FileError:
        self._log(FATAL, text)
        return FileError(f"{self._tag} {text}")

    @property
    def is_open(self) -> bool:
        return self._file is not None

    def current_filename(self) -> str:
        stamp = strftime(self.opts.datetime_format, time.localtime(self._wall_clock()))
        return self.name_format.replace("<DATETIME>", stamp)

    def needs_rotation(self) -> bool:
        if self._file is None:
            return True
        filename = self.current_filename()
        if filename != self.filename:
            self._log(INFO, f"new filename {filename}, rotating...")
            return True
        if self.opts.rotate_interval > 0:
            elapsed = self._monotonic() - self.open_time
            if elapsed > self.opts.rotate_interval:
                self._log(INFO, f"{format_duration(elapsed)} since last open, rotating...")
                return True
        if self.opts.rotate_size > 0 and self.filesize > self.opts.rotate_size:
            self._log(INFO, f"{self.path} currently {self.filesize} bytes (> {self.opts.rotate_size}), rotating...")
            return True
        return False

    def update_file(self) -> None:
        """Close the current file (if any) and open the next one."""
        self.close()
        filename = self.current_filename()
        if filename != self.filename:
            self.rev = 0
        else:
            self.rev += 1
        self.filename = filename
        self.open_time = self._monotonic()
        opts = self.opts
        exclusive = opts.gzip or opts.rotate_interval > 0
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND) | getattr(os, "O_CLOEXEC", 0)
        while True:
            relative = os.path.normpath(filename.replace("<REV>", _rev(self.rev)))
            path = os.path.join(opts.work_dir, relative)
            try:
                _make_parent(path)
            except OSError as exc:
                raise self._fatal(f"unable to create dir: {exc}") from None
            if opts.separate_work_dir:
                target = os.path.join(opts.output_dir, relative)
                try:
                    _make_parent(target)
                except OSError as exc:
                    raise self._fatal(f"unable to create dir: {exc}") from None
                if os.path.lexists(target):
                    self._log(WARN, f"output file already exists: {target}")
                    self.rev += 1
                    continue
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self._log(WARN, f"working file already exists: {path}")
                self.rev += 1
                continue
            except OSError as exc:
                raise self._fatal(f"unable to open {path}: {exc}") from None
            self._log(INFO, f"opening {path}")
            self.filesize = os.fstat(fd).st_size
            if opts.rotate_size > 0 and self.filesize > opts.rotate_size:
                self._log(INFO, f"{path} currently {self.filesize} bytes (> {opts.rotate_size}), rotating...")
                os.close(fd)
                self.rev += 1
                continue
            break
        self._file = os.fdopen(fd, "ab" if not exclusive else "wb", buffering=1 << 16)
        self.path, self.relative = path, relative
        self._gzip = self._new_member() if opts.gzip else None

    def _new_member(self) -> Any:
        # wbits 31: a gzip header and trailer around the deflate stream, mtime 0 and no name, as Go writes them
        return zlib.compressobj(self.opts.gzip_level, zlib.DEFLATED, 31)

    def write(self, data: bytes) -> None:
        try:
            if self._gzip is not None:
                self._file.write(self._gzip.compress(data))
            else:
                self._file.write(data)
        except OSError as exc:
            raise self._fatal(f"writing message to disk: {exc}") from None
        self.filesize += len(data)

    def _end_member(self) -> None:
        if self._gzip is not None:
            self._file.write(self._gzip.flush(zlib.Z_FINISH))

    def sync(self) -> None:
        """Make everything written so far durable (for gzip: end the member, fsync, start a new member)."""
        if self._file is None:
            return
        try:
            self._end_member()
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise self._fatal(f"failed syncing messages: {exc}") from None
        if self._gzip is not None:
            self._gzip = self._new_member()

    def close(self) -> None:
        """End the gzip stream, fsync, close and (with a work dir) move the file to the output dir."""
        if self._file is None:
            return
        file, path, relative = self._file, self.path, self.relative
        try:
            self._end_member()
        except OSError as exc:
            raise self._fatal(f"failed to close GZIP writer: {exc}") from None
        try:
            file.flush()
            os.fsync(file.fileno())
        except OSError as exc:
            raise self._fatal(f"failed to fsync output file: {exc}") from None
        self._file = self._gzip = None
        try:
            file.close()
        except OSError as exc:
            raise self._fatal(f"failed to close output file: {exc}") from None
        assert path is not None
        final = path
        if self.opts.separate_work_dir:
            final = self._move(path, relative)
        self.files_closed.append(final)

    def _move(self, src: str, relative: str) -> str:
        dst = os.path.join(self.opts.output_dir, relative)
        self._log(INFO, f"moving finished file {src} to {dst}")
        try:
            _exclusive_rename(src, dst)
            return dst
        except FileExistsError:
            pass
        except OSError as exc:
            raise self._fatal(f"unable to move file from {src} to {dst}: {exc}") from None
        # someone made a file of that name meanwhile: the next free revision of the same name
        template = os.path.join(self.opts.output_dir, os.path.dirname(relative), os.path.basename(self.filename))
        number = self.rev + 1
        while True:
            self._log(WARN, f"destination file already exists: {dst}")
            dst = template.replace("<REV>", _rev(number))
            try:
                _exclusive_rename(src, dst)
            except FileExistsError:
                number += 1
                continue
            except OSError as exc:
                raise self._fatal(f"unable to rename file from {src} to {dst}: {exc}") from None
            self._log(INFO, f"renamed finished file {src} to {dst} to avoid overwrite")
            return dst


# --- messages: written, synced, then FIN'd --------------------------------------------------------------------------


class Finishable(Protocol):
    body: bytes
    nsqd_address: str

    def finish(self) -> None: ...


class TopicWriter:
    """One topic's messages on their way to disk: which are written, which are durable (see the module notes).

    Every method returns the messages an fsync has just covered; the caller FINs them (on the event loop: these
    methods do blocking file I/O and are meant to run in a worker thread, while ``finish()`` must not)."""

    def __init__(self, logger: FileLogger) -> None:
        self.logger = logger
        self.pending: list[Finishable] = []

    def write(self, messages: list[Finishable], *, sync: bool = False) -> list[Finishable]:
        """Write ``messages`` in order; ``sync``: make them durable now (the consumer is starved, or stopping)."""
        logger = self.logger
        cap = max(1, logger.opts.max_in_flight)
        done: list[Finishable] = []
        for message in messages:
            if logger.needs_rotation():
                logger.update_file()
                sync = True  # the old file's messages were synced by its close
            logger.write(message.body)
            logger.write(b"\n")
            self.pending.append(message)
            if len(self.pending) >= cap:
                done += self.flush()
        if sync:
            done += self.flush()
        return done

    def tick(self) -> list[Finishable]:
        """The sync interval passed: rotate if due (with ``--skip-empty-files``, close instead of opening an empty
        file), then sync."""
        logger = self.logger
        close = False
        if logger.needs_rotation():
            if logger.opts.skip_empty_files:
                close = True
            else:
                logger.update_file()
        done = self.flush()
        if close:
            logger.close()
        return done

    def close(self) -> list[Finishable]:
        """Sync and close the file (SIGHUP, or the consumer stopped); the next message opens a new one."""
        done = self.flush()
        self.logger.close()
        return done

    def flush(self) -> list[Finishable]:
        if not self.pending:
            return []
        self.logger._log(INFO, f"syncing {len(self.pending)} records to disk")
        self.logger.sync()
        done, self.pending = self.pending, []
        return done
