"""NSQ's log lines for the three daemons, written through the standard ``logging`` module.

One line per event, exactly as NSQ prints them (Go's ``log.Ldate|log.Ltime|log.Lmicroseconds``,
local time, then NSQ's level word)::

    [nsqd] 2026/11/21 12:00:00.123456 INFO: TCP: listening on 127.0.0.1:4150

The prefix is ``--log-prefix`` (``[nsqd] ``, ``[nsqlookupd] ``, ``[nsqadmin] ``). Modules log through
``logging.getLogger("nsqd")`` or a child such as ``nsqd.tcp``; ``setup_logging`` attaches the one
handler that writes these lines and sets the level from ``--log-level``. NSQ's levels are words
(debug, info, warn, error, fatal) or the integers 1..5 that ``GET /config/log_level`` reports; they
map onto logging's DEBUG..CRITICAL, and CRITICAL prints as ``FATAL`` like NSQ.

A record carrying an exception prints its one-line summary (``...: ValueError: bad``); the full
traceback follows, indented, only while the logger is at debug level, so a normal log keeps one
line per event. Every line is a single ``write`` followed by a flush, and a broken stream or a bad
format string never raises into the code that logged.

Inside a daemon's event loop (``run_daemon`` installs ``LogFlusher`` as a trio instrument) the INFO and DEBUG
lines of one turn of the loop are written together, in order, just before the loop waits for I/O: nsqd logs
every HTTP request, and one ``write`` per line was a system call per request. A WARNING or worse line is
written at once, after the lines before it, and lines logged by other threads are not held. Nothing is held
while the loop waits, so no line is late by more than the turn that logged it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

__all__ = [
    "DEBUG",
    "ERROR",
    "FATAL",
    "INFO",
    "WARN",
    "NSQFormatter",
    "LogFlusher",
    "NSQHandler",
    "format_line",
    "get_log_level",
    "log_flusher",
    "log_level_word",
    "parse_log_level",
    "set_log_level",
    "setup_logging",
    "to_logging_level",
]

# NSQ's integer log levels (internal/lg), as reported by GET /config/log_level.
DEBUG = 1
INFO = 2
WARN = 3
ERROR = 4
FATAL = 5

_WORDS = {"debug": DEBUG, "info": INFO, "warn": WARN, "error": ERROR, "fatal": FATAL}
_WORD_OF = {level: word for word, level in _WORDS.items()}
_TO_LOGGING = {
    DEBUG: logging.DEBUG,
    INFO: logging.INFO,
    WARN: logging.WARNING,
    ERROR: logging.ERROR,
    FATAL: logging.CRITICAL,
}
# Labels NSQ prints; checked from the highest threshold down so custom levels land sensibly.
_LABELS = (
    (logging.CRITICAL, "FATAL"),
    (logging.ERROR, "ERROR"),
    (logging.WARNING, "WARNING"),
    (logging.INFO, "INFO"),
)


def parse_log_level(value: str | int) -> int:
    """NSQ's level (1..5) for ``debug|info|warn|error|fatal`` (any case) or an integer 1..5.

    Raises ``ValueError`` with NSQ's message, which ``PUT /config/log_level`` returns as is.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if DEBUG <= value <= FATAL:
            return value
    elif isinstance(value, str):
        word = value.strip().lower()
        if word in _WORDS:
            return _WORDS[word]
        if word in ("1", "2", "3", "4", "5"):
            return int(word)
    raise ValueError(f"invalid log level '{value}' (debug, info, warn, error, fatal)")


def log_level_word(level: str | int) -> str:
    """The ``--log-level`` word (``"info"``) for any accepted spelling of a level."""
    return _WORD_OF[parse_log_level(level)]


def to_logging_level(level: str | int) -> int:
    """logging's number (``logging.INFO``...) for an NSQ level word or integer."""
    return _TO_LOGGING[parse_log_level(level)]


def _label(levelno: int) -> str:
    for threshold, label in _LABELS:
        if levelno >= threshold:
            return label
    return "DEBUG"


def format_line(prefix: str, label: str, message: str, created: float | None = None) -> str:
    """One NSQ log line without its newline: ``<prefix>YYYY/MM/DD hh:mm:ss.uuuuuu <LABEL>: <message>``.

    ``created`` is a Unix time in seconds (now when omitted); microseconds are truncated, like Go.
    """
    if created is None:
        created = time.time()
    micros = int(round(created * 1_000_000))
    seconds, micro = divmod(micros, 1_000_000)
    key = (seconds, time.timezone)
    if _stamp[0] != key:
        _stamp[:] = [key, time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(seconds))]
    return f"{prefix}{_stamp[1]}.{micro:06d} {label}: {message}"


#: the date and time of the last second a line was formatted in (lines come many per second)
_stamp: list[Any] = [None, ""]


class NSQFormatter(logging.Formatter):
    """Formats records as NSQ log lines (see the module notes)."""

    def __init__(self, prefix: str = "[nsqd] ", *, tracebacks: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.prefix = prefix
        self._tracebacks = tracebacks if tracebacks is not None else (lambda: False)

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:  # a wrong format string must not lose the event
            message = f"{record.msg} {record.args!r}"
        exc_info = record.exc_info
        if exc_info and exc_info[1] is not None:
            summary = "".join(traceback.format_exception_only(exc_info[0], exc_info[1])).strip()
            message = f"{message}: {summary}"
            if self._tracebacks():
                detail = "".join(traceback.format_exception(*exc_info)).rstrip()
                message += "\n" + "\n".join("    " + line for line in detail.splitlines())
        return format_line(self.prefix, _label(record.levelno), message, record.created)


class NSQHandler(logging.Handler):
    """Writes each record as one line to ``stream`` (``sys.stderr`` looked up at write time when None)."""

    def __init__(
        self, prefix: str = "[nsqd] ", stream: TextIO | None = None, *, tracebacks: Callable[[], bool] | None = None
    ) -> None:
        super().__init__()
        self.stream = stream
        self._line_format = NSQFormatter(prefix, tracebacks=tracebacks)
        self.setFormatter(self._line_format)
        self._pending: list[str] | None = None  # lines held until ``write_pending`` (a ``LogFlusher`` is on)
        self._holder: int | None = None  # the thread whose lines are held (the event loop's)

    @property
    def prefix(self) -> str:
        return self._line_format.prefix

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            return
        pending = self._pending
        if pending is not None and threading.get_ident() == self._holder:
            pending.append(line)
            if record.levelno >= logging.WARNING or len(pending) >= _MAX_PENDING:
                self.write_pending()
            return
        self._write(line)

    def hold_lines(self, hold: bool) -> None:
        """Hold this thread's INFO and DEBUG lines until ``write_pending`` (True), or write each at once (False)."""
        with self.lock:
            if hold:
                self._holder = threading.get_ident()
                if self._pending is None:
                    self._pending = []
            else:
                self.write_pending()
                self._pending = self._holder = None

    def write_pending(self) -> None:
        """Write the held lines, in order, with one ``write``."""
        with self.lock:
            pending = self._pending
            if pending:
                self._pending = []
                self._write("".join(pending))

    def _write(self, text: str) -> None:
        try:
            stream = self.stream if self.stream is not None else sys.stderr
            stream.write(text)
            stream.flush()
        except Exception:
            pass

    def close(self) -> None:
        self.write_pending()
        super().close()

    def handleError(self, record: logging.LogRecord) -> None:  # never print logging's own tracebacks
        pass


#: held lines are written at once past this many, whatever the loop does
_MAX_PENDING = 512


class LogFlusher:
    """A trio instrument (trio takes any object with the hook methods, so this module imports no trio) that makes
    ``handler`` hold the loop's INFO and DEBUG lines while tasks run and write them, once per turn, before the loop
    waits for I/O (see the module notes)."""

    def __init__(self, handler: NSQHandler) -> None:
        self.handler = handler

    def before_run(self) -> None:
        self.handler.hold_lines(True)

    def before_io_wait(self, timeout: float) -> None:
        if self.handler._pending:
            self.handler.write_pending()

    def after_run(self) -> None:
        self.handler.hold_lines(False)


def log_flusher(logger: logging.Logger) -> LogFlusher | None:
    """The ``LogFlusher`` for the handler ``setup_logging`` gave ``logger``; None when it has none."""
    for handler in logger.handlers:
        if isinstance(handler, NSQHandler):
            return LogFlusher(handler)
    return None


def setup_logging(
    prefix: str = "[nsqd] ", level: str | int = "info", stream: TextIO | None = None, *, name: str = "nsqd"
) -> logging.Logger:
    """Configure ``logging.getLogger(name)`` to print NSQ lines at ``level`` and return it.

    Calling it again replaces the handler it installed before (tests and restarts do this).
    The logger stops propagating to the root logger, so no other handler prints the event again.
    ``stream=None`` writes to whatever ``sys.stderr`` is at the time of each line.
    """
    logger = logging.getLogger(name)
    for old in [h for h in logger.handlers if isinstance(h, NSQHandler)]:
        logger.removeHandler(old)
    logger.setLevel(to_logging_level(level))
    logger.propagate = False  # one line per event, even when something else configured the root logger
    logger.addHandler(NSQHandler(prefix, stream, tracebacks=lambda: logger.isEnabledFor(logging.DEBUG)))
    return logger


def set_log_level(logger: logging.Logger, level: str | int) -> int:
    """Change the level at run time (``PUT /config/log_level``); returns NSQ's integer level.

    Raises ``ValueError`` (NSQ's message) and leaves the level alone when ``level`` is invalid.
    """
    nsq_level = parse_log_level(level)
    logger.setLevel(_TO_LOGGING[nsq_level])
    return nsq_level


def get_log_level(logger: logging.Logger) -> int:
    """NSQ's integer level (1..5) for the logger's effective level."""
    levelno = logger.getEffectiveLevel()
    for nsq_level in (FATAL, ERROR, WARN, INFO):
        if levelno >= _TO_LOGGING[nsq_level]:
            return nsq_level
    return DEBUG
