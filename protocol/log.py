"""Log channels read by offset (nsqd/LOG-PROTOCOL.md), sans I/O: the commands and the range layout.

Client side: ``encode_log``, ``encode_lseek``, ``encode_lread``, ``encode_lcommit`` make the command lines;
``decode_offsets`` reads the JSON answers; ``decode_range`` reads an LREAD answer (a response frame's data)
into its columns without a step per message. Server side: ``parse_log_request`` checks a command's parameters
(NSQ's codes and texts), ``encode_offsets`` makes the JSON answers and ``Columns`` holds a batch of messages in
the range layout's columns, which nsqd's log files hold too (``nsqd/queues/offset_log.py``): it slices and
joins them by message without touching each message.

Nothing here imports trio: the Spark executors use it with ``trionsq.blocking``'s connection.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Any, Generic, NamedTuple, TypeVar

from .errors import E_BAD_CHANNEL, E_BAD_PROTOCOL, E_BAD_TOPIC, E_INVALID, ProtocolError
from .names import encode_name, go_quote, is_ephemeral, is_valid_channel_name, is_valid_topic_name

__all__ = [
    "DEFAULT_MAX_BYTES",
    "E_LOG_BAD_RANGE",
    "E_LOG_BEFORE_START",
    "E_LOG_FAILED",
    "E_LOG_NOT_LOG",
    "E_LOG_PAST_END",
    "E_LOG_UNKNOWN",
    "LOG_COMMANDS",
    "MAX_MAX_BYTES",
    "RANGE_HEADER_SIZE",
    "RANGE_MAGIC",
    "Columns",
    "LogRange",
    "LogRequest",
    "decode_offsets",
    "decode_range",
    "encode_lcommit",
    "encode_log",
    "encode_lread",
    "encode_lseek",
    "encode_offsets",
    "encode_range",
    "parse_log_request",
]

E_LOG_UNKNOWN = "E_LOG_UNKNOWN"
E_LOG_NOT_LOG = "E_LOG_NOT_LOG"
E_LOG_BAD_RANGE = "E_LOG_BAD_RANGE"
E_LOG_BEFORE_START = "E_LOG_BEFORE_START"
E_LOG_PAST_END = "E_LOG_PAST_END"
E_LOG_FAILED = "E_LOG_FAILED"

#: the commands, with the names of their numeric parameters (after topic and channel) and how many are optional
_SYNTAX: dict[bytes, tuple[tuple[str, ...], int]] = {
    b"LOG": ((), 0),
    b"LSEEK": (("timestamp",), 0),
    b"LREAD": (("from", "to", "max_bytes"), 1),
    b"LCOMMIT": (("offset",), 0),
}
LOG_COMMANDS = frozenset(_SYNTAX)

DEFAULT_MAX_BYTES = 1 << 20
MAX_MAX_BYTES = 64 << 20
_MAX_NUMBER = (1 << 63) - 1

RANGE_MAGIC = b"NLR1"
_HEADER = struct.Struct(">4sIQQ")
RANGE_HEADER_SIZE = _HEADER.size  # 24
#: fixed bytes per message in the columns: timestamp 8, ID 16, length 4, attempts 2
PER_MESSAGE = 30


# -- commands --------------------------------------------------------------------------------------


def encode_log(topic: str, channel: str) -> bytes:
    return b"LOG %s %s\n" % (encode_name(topic), encode_name(channel))


def encode_lseek(topic: str, channel: str, timestamp_ns: int) -> bytes:
    return b"LSEEK %s %s %d\n" % (encode_name(topic), encode_name(channel), timestamp_ns)


def encode_lread(topic: str, channel: str, first: int, to: int, max_bytes: int = 0) -> bytes:
    if max_bytes:
        return b"LREAD %s %s %d %d %d\n" % (encode_name(topic), encode_name(channel), first, to, max_bytes)
    return b"LREAD %s %s %d %d\n" % (encode_name(topic), encode_name(channel), first, to)


def encode_lcommit(topic: str, channel: str, offset: int) -> bytes:
    return b"LCOMMIT %s %s %d\n" % (encode_name(topic), encode_name(channel), offset)


class LogRequest(NamedTuple):
    """A checked command: its name (str), topic, channel and numbers (absent optional ones are None)."""

    verb: str
    topic: str
    channel: str
    numbers: tuple[int | None, ...]


def _number(verb: str, field: str, raw: bytes) -> int:
    if not raw or not raw.isdigit() or len(raw) > 19 or int(raw) > _MAX_NUMBER:
        raise ProtocolError(E_INVALID, f"{verb} could not parse {field} {raw.decode('utf-8', 'surrogateescape')}")
    return int(raw)


def parse_log_request(name: bytes, params: Sequence[bytes]) -> LogRequest:
    """The parameters of LOG, LSEEK, LREAD or LCOMMIT, checked in this order: their count, the names, the
    numbers. Raises ``ProtocolError`` with the code and text of LOG-PROTOCOL.md's table."""
    fields, optional = _SYNTAX[name]
    verb = name.decode()
    if len(params) < 2 + len(fields) - optional:
        raise ProtocolError(E_INVALID, f"{verb} insufficient number of parameters")
    if len(params) > 2 + len(fields):
        raise ProtocolError(E_INVALID, f"{verb} too many parameters")
    topic = params[0].decode("utf-8", "surrogateescape")
    channel = params[1].decode("utf-8", "surrogateescape")
    if not is_valid_topic_name(topic):
        raise ProtocolError(E_BAD_TOPIC, f"{verb} topic name {go_quote(topic)} is not valid")
    if not is_valid_channel_name(channel):
        raise ProtocolError(E_BAD_CHANNEL, f"{verb} channel name {go_quote(channel)} is not valid")
    if is_ephemeral(topic) or is_ephemeral(channel):
        raise ProtocolError(E_INVALID, f"{verb} ephemeral topic or channel {topic}:{channel} cannot be a log")
    numbers = tuple(_number(verb, field, raw) for field, raw in zip(fields, params[2:], strict=False))
    return LogRequest(verb, topic, channel, numbers + (None,) * (len(fields) - len(numbers)))  # None: left out


# -- JSON answers ----------------------------------------------------------------------------------


def encode_offsets(start: int, committed: int, end: int, **extra: object) -> bytes:
    """LOG's, LSEEK's and LCOMMIT's answer: ``{"start": S, "committed": C, "end": E}`` and ``extra`` (LSEEK's
    ``offset``; LOG's takeover notes, lists of objects)."""
    return json.dumps({**extra, "start": start, "committed": committed, "end": end}, separators=(",", ":")).encode()


def decode_offsets(data: bytes | bytearray) -> dict[str, int]:
    """An offsets answer as a dict (``start``, ``committed``, ``end``, and LSEEK's ``offset``). Anything else
    raises ``ProtocolError(E_BAD_PROTOCOL)``."""
    try:
        obj = json.loads(data)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not all(
        isinstance(obj.get(key), int) and obj[key] >= 0 for key in ("start", "committed", "end")
    ):
        raise ProtocolError(E_BAD_PROTOCOL, f"not a log offsets answer: {bytes(data[:80])!r}")
    return obj


# -- the range layout ------------------------------------------------------------------------------


#: a column's bytes: ``bytes``, or ``memoryview`` slices of a received range (no copy)
_B = TypeVar("_B", bytes, memoryview)


class Columns(Generic[_B]):
    """A run of messages in the range layout's columns (bytes objects): ``timestamps`` (int64 each), ``ids``
    (16 bytes each), ``lengths`` (uint32 each), ``attempts`` (uint16 each) and the ``bodies`` back to back.
    ``starts`` holds, once asked for, where each body starts in ``bodies`` (``count + 1`` positions)."""

    __slots__ = ("count", "timestamps", "ids", "lengths", "attempts", "bodies", "_starts")
    timestamps: _B
    ids: _B
    lengths: _B
    attempts: _B
    bodies: _B

    def __init__(self, count: int, timestamps: _B, ids: _B, lengths: _B, attempts: _B, bodies: _B) -> None:
        self.count = count
        self.timestamps = timestamps
        self.ids = ids
        self.lengths = lengths
        self.attempts = attempts
        self.bodies = bodies
        self._starts: list[int] | None = None

    @classmethod
    def from_messages(
        cls, ids: Sequence[bytes], timestamps: Sequence[int], attempts: Sequence[int], bodies: Sequence[bytes]
    ) -> Columns[bytes]:
        """The columns of messages given as parallel sequences (one pack per column)."""
        count = len(ids)
        if any(len(i) != 16 for i in ids):
            raise ValueError("message IDs are 16 bytes")
        return Columns(
            count,
            struct.pack(f">{count}q", *timestamps),
            b"".join(ids),
            struct.pack(f">{count}I", *map(len, bodies)),
            struct.pack(f">{count}H", *attempts),
            b"".join(bodies),
        )

    @classmethod
    def from_payload(cls, data: _B, count: int) -> Columns[_B]:
        """Columns stored back to back (a log file's chunk, a range frame after its header); ``data`` holds
        exactly ``count`` messages. Raises ValueError when the lengths do not add up to the bodies."""
        p = 8 * count
        q = p + 16 * count
        r = q + 4 * count
        s = r + 2 * count
        if len(data) < s:
            raise ValueError(f"{len(data)} bytes cannot hold the columns of {count} messages")
        columns = Columns(count, data[:p], data[p:q], data[q:r], data[r:s], data[s:])
        if columns.body_starts()[-1] != len(columns.bodies):
            raise ValueError(
                f"body lengths add up to {columns.body_starts()[-1]}, {len(columns.bodies)} bytes of bodies follow"
            )
        return columns

    def body_starts(self) -> list[int]:
        starts = self._starts
        if starts is None:
            starts = self._starts = [0, *accumulate(struct.unpack(f">{self.count}I", self.lengths))]
        return starts

    def size(self, i: int = 0, j: int | None = None) -> int:
        """Bytes that messages ``[i, j)`` take in the columns."""
        if j is None:
            j = self.count
        starts = self.body_starts()
        return PER_MESSAGE * (j - i) + starts[j] - starts[i]

    def fitting(self, i: int, budget: int) -> int:
        """The largest ``j >= i`` such that messages ``[i, j)`` take at most ``budget`` bytes (binary search)."""
        starts = self.body_starts()
        lo, hi = i, self.count
        base = starts[i] + PER_MESSAGE * i
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if PER_MESSAGE * mid + starts[mid] - base <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def slice(self, i: int, j: int) -> Columns[_B]:
        if i == 0 and j == self.count:
            return self
        starts = self.body_starts()
        return Columns(
            j - i,
            self.timestamps[8 * i : 8 * j],
            self.ids[16 * i : 16 * j],
            self.lengths[4 * i : 4 * j],
            self.attempts[2 * i : 2 * j],
            self.bodies[starts[i] : starts[j]],
        )

    def timestamp_list(self) -> tuple[int, ...]:
        return struct.unpack(f">{self.count}q", self.timestamps)

    def id_list(self) -> list[_B]:
        ids = self.ids
        return [ids[k : k + 16] for k in range(0, 16 * self.count, 16)]

    def payload(self) -> list[_B]:
        """The columns back to back, as pieces for one write or join."""
        return [self.timestamps, self.ids, self.lengths, self.attempts, self.bodies]

    @staticmethod
    def join_payload(runs: Sequence[Columns[Any]]) -> list[bytes]:
        """The payload of several runs as one run (column by column), as pieces."""
        return [
            b"".join(r.timestamps for r in runs),
            b"".join(r.ids for r in runs),
            b"".join(r.lengths for r in runs),
            b"".join(r.attempts for r in runs),
            b"".join(r.bodies for r in runs),
        ]


def encode_range(first: int, end: int, runs: Sequence[Columns[Any]]) -> bytes:
    """LREAD's answer (a response frame's data) holding ``runs`` one after the other from offset ``first``;
    ``end`` is the log's end offset."""
    count = sum(r.count for r in runs)
    return b"".join([_HEADER.pack(RANGE_MAGIC, count, first, end), *Columns.join_payload(runs)])


class LogRange(NamedTuple):
    """A decoded LREAD answer. The columns are memoryviews into the frame's data (no copy): ``timestamps``
    (big-endian int64), ``ids`` (16 bytes each), ``lengths`` (big-endian uint32), ``attempts`` (big-endian
    uint16), ``bodies`` (back to back). Message ``i`` has offset ``first + i``; ``end`` is the log's end offset
    when nsqd read the range. With numpy: ``np.frombuffer(r.timestamps, ">i8")``, and the bodies' offsets are
    ``np.cumsum(np.frombuffer(r.lengths, ">u4"))`` after a 0."""

    first: int
    end: int
    count: int  # type: ignore[assignment]  # the range's message count; shadows tuple.count, unused here
    timestamps: memoryview
    ids: memoryview
    lengths: memoryview
    attempts: memoryview
    bodies: memoryview

    @property
    def next(self) -> int:
        """The offset after the last message: where the next LREAD of a larger range starts."""
        return self.first + self.count

    def messages(self) -> Iterator[tuple[int, bytes, int, int, bytes]]:
        """``(offset, id, timestamp, attempts, body)`` per message: for tests and small readers (a Python
        object per message; a columnar reader uses the columns)."""
        count = self.count
        ids = bytes(self.ids)
        bodies = bytes(self.bodies)
        starts = [0, *accumulate(struct.unpack(f">{count}I", self.lengths))]
        return zip(
            range(self.first, self.first + count),
            (ids[k : k + 16] for k in range(0, 16 * count, 16)),
            struct.unpack(f">{count}q", self.timestamps),
            struct.unpack(f">{count}H", self.attempts),
            (bodies[a:b] for a, b in pairwise(starts)),
            strict=True,
        )


def decode_range(data: bytes | bytearray | memoryview) -> LogRange:
    """An LREAD answer's data (``bytes``, ``bytearray`` or ``memoryview``) into its columns. Anything that is not
    exactly one range in the layout (wrong magic, cut short, trailing bytes, lengths that do not add up) raises
    ``ProtocolError(E_BAD_PROTOCOL)``."""
    view = memoryview(data)
    if len(view) < RANGE_HEADER_SIZE:
        raise ProtocolError(E_BAD_PROTOCOL, f"range of {len(view)} bytes is shorter than its header")
    magic, count, first, end = _HEADER.unpack_from(view)
    if magic != RANGE_MAGIC:
        raise ProtocolError(E_BAD_PROTOCOL, f"not a log range (magic {bytes(magic)!r})")
    if first + count > end:
        raise ProtocolError(E_BAD_PROTOCOL, f"range [{first}, {first + count}) past its end {end}")
    try:
        columns = Columns.from_payload(view[RANGE_HEADER_SIZE:], count)
    except (ValueError, struct.error) as exc:
        raise ProtocolError(E_BAD_PROTOCOL, f"bad log range: {exc}") from None
    return LogRange(
        first, end, count, columns.timestamps, columns.ids, columns.lengths, columns.attempts, columns.bodies
    )
