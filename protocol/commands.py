"""V2 commands: the server-side parser and the client-side encoders.

Wire syntax: one line ending in ``\\n`` (one trailing ``\\r`` is dropped), split on single spaces
(two spaces give an empty parameter), the first field is the case-sensitive name. IDENTIFY,
AUTH, PUB and DPUB are followed by ``[int32 size][size bytes]``; MPUB by
``[int32 body size][int32 count]`` and ``count`` times ``[int32 size][bytes]``.

The parser performs every check NSQ makes before and while reading a body, in NSQ's order and
with NSQ's texts, and raises as soon as the bytes received decide it: a PUB to a bad topic fails
before its body arrives, an oversized body fails on its four size bytes and is never buffered.
What NSQ checks after the body (authorisation, state, the JSON of IDENTIFY) and all commands
without a body are left to the server; optionally, ``line_check`` lets the server run its own
earlier checks (state, TLS policy) on each line before the parser's.

Buffering and speed: unread bytes are one immutable ``bytes`` object with a read offset, so a
parameter or a body is a single slice, and bytes slices are hashable, which lets the parser
remember the lines of body commands it has already validated (``PUB topic`` repeats endlessly
on a producer's connection): a repeated line costs one dict lookup instead of a split and a name
check. The buffer is compacted only when new data arrives, never per command. While a step is
known to be incomplete (a body of known size, or a line with no newline yet), arriving data is
queued and joined only when it can complete the step, so large bodies are not copied per chunk.

Limits: a line (with its ``\\n``) must fit in ``max_line_length`` bytes, like NSQ's 16 KiB read
buffer; otherwise ``LineTooLong`` (the connection is dropped without an error frame).

After the parser raises, it keeps raising the same exception: the connection is to be closed.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

from ._input import InputBuffer
from .errors import (
    E_BAD_BODY,
    E_BAD_MESSAGE,
    E_BAD_TOPIC,
    E_INVALID,
    LineTooLong,
    ProtocolError,
)
from .names import decode_name, encode_name, go_quote, is_valid_name_bytes

__all__ = [
    "CLS",
    "MAGIC_V2",
    "NOP",
    "Command",
    "CommandParser",
    "encode_auth",
    "encode_command",
    "encode_dpub",
    "encode_fin",
    "encode_identify",
    "encode_mpub",
    "encode_pub",
    "encode_rdy",
    "encode_req",
    "encode_sub",
    "encode_touch",
    "ms_to_go_duration",
    "parse_base10",
]

MAGIC_V2 = b"  V2"
NOP = b"NOP\n"
CLS = b"CLS\n"

_UINT64_MASK = (1 << 64) - 1
_NS_PER_MS = 1_000_000

_int32 = struct.Struct(">i")
_unpack_int = _int32.unpack_from
_pack_int = _int32.pack

#: MPUB bodies of one size are cut by ``Struct.unpack_from`` ("4x<size>s" repeated), at most
#: _MPUB_CUT_RUN per call so that a Struct stays small (a few KB), kept by (size, count)
_mpub_cutters: dict[tuple[int, int], struct.Struct] = {}
_MPUB_CUTTERS_MAX = 64
_MPUB_CUT_RUN = 256


def _cut_bodies(buf: bytes, pos: int, size: int, count: int) -> list[bytes]:
    """``count`` bodies of ``size`` bytes from ``buf[pos:]``, each after its 4-byte size field."""
    bodies: list[bytes] = []
    while count:
        run = min(count, _MPUB_CUT_RUN)
        cutter = _mpub_cutters.get((size, run))
        if cutter is None:
            if len(_mpub_cutters) >= _MPUB_CUTTERS_MAX:
                _mpub_cutters.clear()
            cutter = _mpub_cutters[(size, run)] = struct.Struct(f"4x{size}s" * run)
        bodies += cutter.unpack_from(buf, pos)
        pos += cutter.size
        count -= run
    return bodies


class Command(NamedTuple):
    """One command. ``params`` exclude the name; ``body`` is None for commands without one and
    the list of message bodies for MPUB.

    One exception, for speed: consecutive ``FIN <id>`` lines that arrive together (a consumer
    answers a batch of messages with one write) come as one FIN command whose ``body`` is the
    list of their ids, in order, ``params`` holding the first. The server handles it as that
    many FINs, each with its own outcome. ``line_check`` sees such a run once, as its first line:
    nothing a check looks at can change between two FINs.
    """

    name: bytes
    params: tuple[bytes, ...]
    body: bytes | list[bytes] | None


_new_command = tuple.__new__  # skips NamedTuple's Python-level __new__ on the hot path


def parse_base10(b: bytes) -> int:
    """NSQ's number parser: ASCII digits only, so a sign or a space is a ValueError.

    Like NSQ, an empty field parses as 0 and the value wraps modulo 2**64 (it is a uint64).
    """
    if not b:
        return 0
    if not b.isdigit():  # for bytes, isdigit() means ASCII 0-9 only
        raise ValueError(f"not a base-10 number: {b!r}")
    if len(b) <= 19:
        return int(b)
    n = 0
    for i in range(0, len(b), 18):  # chunked so huge inputs stay clear of int()'s digit limit
        chunk = b[i : i + 18]
        n = (n * 10 ** len(chunk) + int(chunk)) & _UINT64_MASK
    return n


def ms_to_go_duration(ms: int) -> int:
    """Nanoseconds of ``time.Duration(ms) * time.Millisecond`` with Go's int64 wrap-around,
    for a value from ``parse_base10`` (how NSQ turns REQ and DPUB timeouts into durations)."""
    ns = (ms * _NS_PER_MS) & _UINT64_MASK
    return ns - (1 << 64) if ns >= 1 << 63 else ns


def _raw_text(b: bytes) -> str:
    # Parameters echoed in error texts keep their exact bytes (see ProtocolError.payload).
    return b.decode("utf-8", "surrogateescape")


def _go_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


# Kinds of body command, the first field of a line entry (kind, name, params, label).
_MSG = 1  # PUB, DPUB: one message body, E_BAD_MESSAGE, bounded by max_msg_size
_BODY = 2  # IDENTIFY, AUTH: one body, E_BAD_BODY, bounded by max_body_size
_MPUB = 3
_FAILED = 4  # the parser raised; the entry's params slot holds the exception

#: a run of ``FIN <16 letters or digits>\n`` lines, the FIN fast path
_FIN_RUN = re.compile(rb"(?:FIN [0-9A-Za-z]{16}\n)+")
_FIN_LINE_LENGTH = 21

_BODY_COMMANDS = frozenset({b"PUB", b"DPUB", b"MPUB", b"IDENTIFY", b"AUTH"})
_LINE_CACHE_LIMIT = 256


#: a parsed line as the parser keeps it (cache, current command): ``(kind, name, params, ...)``
_Entry: TypeAlias = tuple[Any, ...]


class CommandParser(InputBuffer):
    """Bytes in, ``Command``s out: ``receive_data(bytes)``, then ``next_command()`` until None.

    ``line_check(name, params)``, when given, is called for every complete line before the
    parser's own checks (once for a run of FIN lines returned as one command, see ``Command``);
    whatever it raises propagates (and ends the parser, like any error).

    At end of input, after ``next_command()`` has returned None, ``pending_eof_error()`` tells
    what NSQ would report for a command cut short.
    """

    __slots__ = (
        "_cur",
        "_stage",
        "_size",
        "_bodies",
        "_count",
        "_cache",
        "_last_line",
        "_last_entry",
        "_max_msg_size",
        "_max_body_size",
        "_max_req_timeout_ms",
        "_max_line_length",
        "line_check",
    )

    def __init__(
        self,
        max_msg_size: int = 1048576,
        max_body_size: int = 5242880,
        max_req_timeout_ms: int = 3600000,
        max_line_length: int = 16384,
        *,
        line_check: Callable[[bytes, tuple[bytes, ...]], None] | None = None,
    ) -> None:
        # _need, what the pending step needs before it can progress: n > 0 bytes after _pos,
        # -1 a newline, 0 nothing known (every arrival is merged at once).
        super().__init__()
        # The body command being read (a line entry) or the failure entry; None between commands.
        self._cur: _Entry | None = None
        self._stage = 0  # MSG/BODY: 0 size, 1 body; MPUB: 0 body size, 1 count, 2 messages
        self._size = -1  # size of the body being read, -1 before its size field
        self._bodies: list[bytes] = []
        self._count = 0
        self._cache: dict[bytes, _Entry] = {}
        # The raw line (with its newline) of the latest PUB/DPUB and its entry for the fast
        # path. Until the first one it holds a genuine valid line, so a match is always right.
        self._last_line = b"PUB _\n"
        self._last_entry: _Entry = (_MSG, b"PUB", (b"_",), "PUB")
        self._max_msg_size = max_msg_size
        self._max_body_size = max_body_size
        self._max_req_timeout_ms = max_req_timeout_ms
        self._max_line_length = max_line_length
        self.line_check = line_check

    # -- input -----------------------------------------------------------------------------

    def _still_incomplete(self, data: bytes, total: int) -> bool:
        # _need > 0: a body of that many bytes; _need < 0: a line, complete once a newline
        # arrives (or once it is too long to be a line at all, which next_command reports)
        need = self._need
        if need > 0:
            return total < need
        return total < self._max_line_length and b"\n" not in data

    def last_pub(self) -> tuple[bytes, bytes] | None:
        """Between commands with nothing unread: the line (newline included) of the latest PUB this parser checked
        and its topic, as bytes; whole commands of that line, with a body size in range, are what ``next_command``
        would return with no check to make (its fastest path). None otherwise, or when the latest was a DPUB.
        For a reader that takes such commands without the parser (``nsqd/fastpath.py``)."""
        if self._cur is not None or self._pos < len(self._buf) or self._chunks_len:
            return None
        entry = self._last_entry
        if entry[1] != b"PUB":
            return None
        return self._last_line, entry[2][0]

    def between_commands(self) -> bool:
        """True when no command is partly decoded: what ``take_unparsed`` returns then starts at a command (or is
        empty), so another parser can take the stream from there."""
        return self._cur is None

    @property
    def max_msg_size(self) -> int:
        return self._max_msg_size

    def buffered_size(self) -> int:
        """Bytes received and not yet consumed by a returned or started command."""
        return len(self._buf) - self._pos + self._chunks_len

    # -- output ----------------------------------------------------------------------------

    def next_command(self) -> Command | None:
        """The next complete command, or None when more data is needed.

        Raises ``ProtocolError`` (NSQ's code and text) or ``LineTooLong``.
        """
        if self._cur is not None:
            return self._continue_body()
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            return None  # nothing unread: the next line is still to come
        last = self._last_line
        if buf.startswith(last, pos):
            # Fastest path: the same PUB/DPUB line as the previous message body command, with
            # its size field and whole body already here and in range.
            start = pos + len(last) + 4
            if start <= len(buf):
                size = _unpack_int(buf, start - 4)[0]
                if 0 < size <= self._max_msg_size:
                    end = start + size
                    if end <= len(buf):
                        last_entry = self._last_entry
                        if self.line_check is not None:
                            self._pos = start - 4  # as the general path leaves it if the check refuses
                            self._run_line_check(last_entry[1], last_entry[2])
                        self._pos = end
                        return _new_command(Command, (last_entry[1], last_entry[2], buf[start:end]))
        if buf.startswith(b"FIN ", pos) and self._max_line_length > 20:
            # Fast path for a consumer's stream of ``FIN <16-byte id>\n``, for ids of letters and
            # digits (nsqd's are hex; any other id, which might hold a separator, takes the general
            # path). One regex match takes the whole run of such lines in the buffer and one split
            # cuts out their ids: a run of one is the command the general path would build, a longer
            # run one FIN command whose body is the list of its ids (see ``Command``).
            run = _FIN_RUN.match(buf, pos)
            if run is not None:
                end = run.end()
                self._pos = end
                if end - pos == _FIN_LINE_LENGTH:
                    msg_ids = None
                    params = (buf[pos + 4 : end - 1],)
                else:
                    msg_ids = buf[pos + 4 : end - 1].split(b"\nFIN ")
                    params = (msg_ids[0],)
                if self.line_check is not None:
                    self._run_line_check(b"FIN", params)
                return _new_command(Command, (b"FIN", params, msg_ids))
        nl = buf.find(b"\n", pos)
        if nl < 0 or nl - pos >= self._max_line_length:
            self._no_line(nl)
            return None
        line = buf[pos:nl]
        self._pos = pos = nl + 1
        entry = self._cache.get(line)
        if entry is None:
            return self._new_line(line)
        if self.line_check is not None:
            self._run_line_check(entry[1], entry[2])
        if entry[0] is _MSG:
            self._last_line = buf[nl - len(line) : nl + 1]
            self._last_entry = entry
        self._cur = entry
        self._stage = 0
        self._size = -1
        return self._continue_body()

    def pending_eof_error(self) -> ProtocolError | None:
        """The error NSQ reports if the peer closes now, or None (between commands, or within
        a command line, which NSQ drops silently). Call it after ``next_command()`` returned None."""
        cur = self._cur
        if cur is None or cur[0] is _FAILED:
            return None
        kind, _name, _params, label = cur
        if kind is _MSG:
            if self._stage == 0:
                return ProtocolError(E_BAD_MESSAGE, f"{label} failed to read message body size")
            return ProtocolError(E_BAD_MESSAGE, f"{label} failed to read message body")
        if kind is _BODY:
            if self._stage == 0:
                return ProtocolError(E_BAD_BODY, f"{label} failed to read body size")
            return ProtocolError(E_BAD_BODY, f"{label} failed to read body")
        if self._stage == 0:
            return ProtocolError(E_BAD_BODY, "MPUB failed to read body size")
        if self._stage == 1:
            return ProtocolError(E_BAD_BODY, "MPUB failed to read message count")
        if self._size < 0:
            return ProtocolError(E_BAD_MESSAGE, f"MPUB failed to read message({len(self._bodies)}) body size")
        return ProtocolError(E_BAD_MESSAGE, "MPUB failed to read message body")

    # -- internals -------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> Exception:
        """Remember ``exc`` so that every later call raises it again; returns it for ``raise``."""
        self._cur = (_FAILED, b"", exc, "")
        self._need = 0
        return exc

    def _error(self, code: str, description: str) -> Exception:
        return self._fail(ProtocolError(code, description))

    def _run_line_check(self, name: bytes, params: tuple[bytes, ...]) -> None:
        try:
            self.line_check(name, params)  # type: ignore[misc]
        except Exception as exc:
            self._fail(exc)
            raise

    def _no_line(self, nl: int) -> None:
        if nl >= 0 or len(self._buf) - self._pos >= self._max_line_length:
            raise self._fail(LineTooLong(self._max_line_length))
        self._need = -1
        return None

    def _new_line(self, line: bytes) -> Command | None:
        """A line not in the cache: split it, run the pre-body checks of body commands."""
        raw = line
        if line.endswith(b"\r"):
            line = line[:-1]
        fields = line.split(b" ")
        name = fields[0]
        params = tuple(fields[1:])
        if self.line_check is not None:
            self._run_line_check(name, params)
        if name not in _BODY_COMMANDS:
            return _new_command(Command, (name, params, None))
        if name == b"PUB":
            if not params:
                raise self._error(E_INVALID, "PUB insufficient number of parameters")
            self._check_topic(params[0], "PUB", "")
            entry = (_MSG, name, params, "PUB")
        elif name == b"DPUB":
            if len(params) < 2:
                raise self._error(E_INVALID, "DPUB insufficient number of parameters")
            self._check_topic(params[0], "DPUB", "")
            self._check_dpub_timeout(params[1])
            entry = (_MSG, name, params, "DPUB")
        elif name == b"MPUB":
            if not params:
                raise self._error(E_INVALID, "MPUB insufficient number of parameters")
            # NSQ's text repeats the code here.
            self._check_topic(params[0], "MPUB", "E_BAD_TOPIC ")
            entry = (_MPUB, name, params, "MPUB")
        elif name == b"AUTH":
            if params:
                raise self._error(E_INVALID, "AUTH invalid number of parameters")
            entry = (_BODY, name, params, "AUTH")
        else:  # IDENTIFY: its parameters are ignored
            entry = (_BODY, name, params, "IDENTIFY")
        if entry[0] is not _BODY:
            cache = self._cache
            if len(cache) >= _LINE_CACHE_LIMIT:
                cache.clear()
            cache[raw] = entry
            if entry[0] is _MSG:
                self._last_line = raw + b"\n"
                self._last_entry = entry
        self._cur = entry
        self._stage = 0
        self._size = -1
        return self._continue_body()

    def _check_topic(self, topic: bytes, label: str, quirk: str) -> None:
        if not is_valid_name_bytes(topic):
            raise self._error(E_BAD_TOPIC, f"{quirk}{label} topic name {go_quote(decode_name(topic))} is not valid")

    def _check_dpub_timeout(self, raw: bytes) -> None:
        try:
            ms = parse_base10(raw)
        except ValueError:
            raise self._error(E_INVALID, f"DPUB could not parse timeout {_raw_text(raw)}") from None
        duration = ms_to_go_duration(ms)
        if duration < 0 or duration > self._max_req_timeout_ms * _NS_PER_MS:
            raise self._error(E_INVALID, f"DPUB timeout {ms} out of range 0-{self._max_req_timeout_ms}")

    def _continue_body(self) -> Command | None:
        cur = self._cur
        kind = cur[0]  # type: ignore[index]
        if kind is _MPUB:
            return self._continue_mpub()
        if kind is _FAILED:
            raise cur[2]  # type: ignore[index]
        buf = self._buf
        pos = self._pos
        size = self._size
        if size < 0:
            if len(buf) - pos < 4:
                self._need = 4
                return None
            size = _unpack_int(buf, pos)[0]
            self._pos = pos = pos + 4
            label = cur[3]  # type: ignore[index]
            if kind is _MSG:
                if size <= 0:
                    raise self._error(E_BAD_MESSAGE, f"{label} invalid message body size {size}")
                if size > self._max_msg_size:
                    raise self._error(E_BAD_MESSAGE, f"{label} message too big {size} > {self._max_msg_size}")
            else:  # NSQ checks "too big" first for IDENTIFY and AUTH
                if size > self._max_body_size:
                    raise self._error(E_BAD_BODY, f"{label} body too big {size} > {self._max_body_size}")
                if size <= 0:
                    raise self._error(E_BAD_BODY, f"{label} invalid body size {size}")
            self._size = size
            self._stage = 1
        end = pos + size
        if end > len(buf):
            self._need = size
            return None
        self._pos = end
        self._need = 0
        self._cur = None
        return _new_command(Command, (cur[1], cur[2], buf[pos:end]))  # type: ignore[index]

    def _continue_mpub(self) -> Command | None:
        buf = self._buf
        pos = self._pos
        if self._stage == 0:
            if len(buf) - pos < 4:
                self._need = 4
                return None
            body_len = _unpack_int(buf, pos)[0]
            self._pos = pos = pos + 4
            if body_len <= 0:
                raise self._error(E_BAD_BODY, f"MPUB invalid body size {body_len}")
            if body_len > self._max_body_size:
                raise self._error(E_BAD_BODY, f"MPUB body too big {body_len} > {self._max_body_size}")
            # NSQ only range-checks body_len; the messages are read by their own sizes.
            self._stage = 1
        if self._stage == 1:
            if len(buf) - pos < 4:
                self._need = 4
                return None
            count = _unpack_int(buf, pos)[0]
            self._pos = pos = pos + 4
            # Each message takes at least 5 bytes (size + 1 byte) after the 4-byte count.
            if count <= 0 or count > _go_div(self._max_body_size - 4, 5):
                raise self._error(E_BAD_BODY, f"MPUB invalid message count {count}")
            self._count = count
            self._bodies = []
            self._size = -1
            self._stage = 2
        bodies = self._bodies
        count = self._count
        max_size = self._max_msg_size
        size = self._size
        n = len(buf)
        if size < 0 and n - pos >= 4:
            # Fast path: publishers batch bodies of one size. For the messages wholly here (all the
            # rest, or as many as this buffer holds), when every size field equals the first (four
            # strided slices compare them in C), the bodies are cut at fixed strides by one struct
            # unpack (a quarter of the cost of a slice per body); the loop below
            # reads whatever is left (a message cut short, other sizes) one by one.
            first = _unpack_int(buf, pos)[0]
            if 0 < first <= max_size:
                stride = first + 4
                here = min(count - len(bodies), (n - pos) // stride)
                end = pos + here * stride
                if (
                    here > 1
                    and buf[pos:end:stride] == buf[pos : pos + 1] * here
                    and buf[pos + 1 : end : stride] == buf[pos + 1 : pos + 2] * here
                    and buf[pos + 2 : end : stride] == buf[pos + 2 : pos + 3] * here
                    and buf[pos + 3 : end : stride] == buf[pos + 3 : pos + 4] * here
                ):
                    bodies.extend(_cut_bodies(buf, pos, first, here))
                    pos = end
        while len(bodies) < count:
            if size < 0:
                if n - pos < 4:
                    self._pos = pos
                    self._size = -1
                    self._need = 4
                    return None
                size = _unpack_int(buf, pos)[0]
                pos += 4
                if size <= 0 or size > max_size:
                    self._pos = pos
                    if size <= 0:
                        raise self._error(E_BAD_MESSAGE, f"MPUB invalid message({len(bodies)}) body size {size}")
                    raise self._error(E_BAD_MESSAGE, f"MPUB message too big {size} > {max_size}")
            end = pos + size
            if end > n:
                self._pos = pos
                self._size = size
                self._need = size
                return None
            bodies.append(buf[pos:end])
            pos = end
            size = -1
        self._pos = pos
        self._size = -1
        self._need = 0
        cur = self._cur
        self._cur = None
        self._bodies = []
        return _new_command(Command, (cur[1], cur[2], bodies))  # type: ignore[index]


# -- client-side encoders ------------------------------------------------------------------


def encode_command(name: bytes, *params: bytes, body: bytes | None = None) -> bytes:
    line = b" ".join((name, *params)) + b"\n"
    if body is None:
        return line
    return line + _pack_int(len(body)) + body


def encode_identify(obj: dict[str, Any]) -> bytes:
    return encode_command(b"IDENTIFY", body=json.dumps(obj, separators=(",", ":")).encode())


def encode_auth(secret: bytes) -> bytes:
    return encode_command(b"AUTH", body=secret)


def encode_sub(topic: str, channel: str) -> bytes:
    return encode_command(b"SUB", encode_name(topic), encode_name(channel))


def encode_rdy(n: int) -> bytes:
    return b"RDY %d\n" % n


def encode_fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def encode_req(msg_id: bytes, delay_ms: int) -> bytes:
    return b"REQ %s %d\n" % (msg_id, delay_ms)


def encode_touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def encode_pub(topic: str, body: bytes) -> bytes:
    return encode_command(b"PUB", encode_name(topic), body=body)


def encode_dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    return encode_command(b"DPUB", encode_name(topic), b"%d" % delay_ms, body=body)


def encode_mpub(topic: str, bodies: list[bytes]) -> bytes:
    parts = [_pack_int(len(bodies))]
    for body in bodies:
        parts.append(_pack_int(len(body)))
        parts.append(body)
    return encode_command(b"MPUB", encode_name(topic), body=b"".join(parts))
