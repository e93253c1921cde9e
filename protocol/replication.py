"""The replication stream between trionsq nodes (magic ``  R1``), sans I/O.

The frames and their rules are documented in ``nsqd/replication/PROTOCOL.md``. ``ReplicationDecoder`` takes
bytes (``receive_data``) and gives events (``next_event``, None when more bytes are needed); ``encode`` turns
an event into its frame. Both directions share the framing ``[uint32 size][uint8 type][payload]``; one
decoder reads either direction. A malformed frame raises ``ProtocolError`` with the code the receiver sends
back in its ERROR frame; the stream cannot be resynchronised after that.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeAlias

from ._input import InputBuffer
from .errors import E_BAD_CHANNEL, E_BAD_PROTOCOL, E_BAD_TOPIC, ProtocolError
from .names import is_ephemeral, is_valid_name_bytes

__all__ = [
    "MAGIC_R1",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_MIN",
    "OP_CREATED",
    "OP_DELETED",
    "OP_EMPTIED",
    "OP_LOG",
    "OP_PAUSED",
    "OP_UNPAUSED",
    "OP_VERSIONS",
    "E_BAD_HELLO",
    "E_BAD_SEQ",
    "E_BAD_VERSION",
    "E_EXITING",
    "E_NODE_CONFLICT",
    "E_STORE_FAILED",
    "E_TAKING_OVER",
    "Ack",
    "Adopted",
    "Ask",
    "ChannelOp",
    "Confirm",
    "Confirmed",
    "Error",
    "Finished",
    "Heartbeat",
    "Hello",
    "Holding",
    "Messages",
    "Ping",
    "Pong",
    "ReplicatedMessage",
    "ReplicationDecoder",
    "Requeued",
    "Synced",
    "Restore",
    "Restored",
    "encode_restore",
    "Welcome",
    "encode",
    "encode_messages",
    "encode_published",
    "frame_version",
    "negotiate",
    "split_ids",
]

MAGIC_R1 = b"  R1"

#: The newest version of the replication protocol this code speaks, and the oldest it still speaks. HELLO
#: carries the origin's range (``version``, ``min_version``), WELCOME the version the replica chose for the
#: stream: the highest both ends speak (``negotiate``). Each side then sends only that version's frames and its
#: decoder refuses the rest (``ReplicationDecoder.version``), so a ring is upgraded one node at a time.
#: Version 2 adds PING/PONG (an idle stream's heartbeat that measures the round trip), and the heal of a damaged
#: origin: SYNCED may name the origin's queues found damaged, and the replica answers with RESTORE frames (the
#: copies the backfill left out of them) and RESTORED; and CHANNEL op ``OP_LOG`` (a channel became a log channel:
#: a takeover makes the replica's a log too). A log channel's commits (FINISHED frames) and its uncommitted
#: messages in a backfill go at either version: a replica of version 1 holds them as an ordinary channel's.
PROTOCOL_VERSION = 2
PROTOCOL_VERSION_MIN = 1

E_BAD_HELLO = "E_BAD_HELLO"
E_NODE_CONFLICT = "E_NODE_CONFLICT"
E_BAD_SEQ = "E_BAD_SEQ"
E_STORE_FAILED = "E_STORE_FAILED"
E_BAD_VERSION = "E_BAD_VERSION"
#: a replica's graceful stop (SIGTERM): it will be back, so its origins try again at once rather than backing off
E_EXITING = "E_EXITING"
#: a replica adopting this origin's messages (a takeover under way) refuses its HELLO until it is done
E_TAKING_OVER = "E_TAKING_OVER"

#: the frame type of ADOPTED (replica to origin, right after WELCOME)
T_ADOPTED = 0x84

OP_CREATED, OP_DELETED, OP_PAUSED, OP_UNPAUSED, OP_EMPTIED = 1, 2, 3, 4, 5
#: version 2: the channel is a log channel (nsqd/LOG-PROTOCOL.md); a stream of version 1 gets op CREATED in its
#: place (a replica of version 1 refuses an op it does not know)
OP_LOG = 6
#: the protocol version that introduced each CHANNEL op newer than version 1 (as ``FRAME_VERSIONS``)
OP_VERSIONS = {OP_LOG: 2}
_OPS = frozenset((OP_CREATED, OP_DELETED, OP_PAUSED, OP_UNPAUSED, OP_EMPTIED, OP_LOG))

T_HELLO, T_FINISHED, T_CHANNEL, T_HEARTBEAT, T_SYNCED, T_MESSAGES = 0x01, 0x03, 0x04, 0x05, 0x06, 0x07
#: a replica asks the node a HELLO named whether that HELLO was its own (a connection of its own); the answer
T_CONFIRM, T_CONFIRMED = 0x08, 0x85
#: a replica asks another replica of the same origin what it holds and adopted of it (a connection of its own)
T_ASK, T_HOLDING = 0x0B, 0x89
#: messages a channel put back (REQ, an in-flight timeout): their attempts and due time there
T_REQUEUED = 0x09
_REQUEUED_ROW = struct.Struct(">16sHq")
#: MESSAGES as earlier versions wrote it, one row per message: decoded still (a replica's store on disk), never sent
T_MESSAGES_ROWS = 0x02
T_WELCOME, T_ACK, T_ERROR = 0x81, 0x82, 0x83
#: version 2: the origin's heartbeat on an idle stream carries its clock, the replica's answer gives it back
T_PING, T_PONG = 0x0A, 0x86
#: version 2: copies a replica sends back to an origin whose backfill named damaged queues, and the end of them
T_RESTORE, T_RESTORED = 0x87, 0x88

#: the protocol version that introduced each frame type newer than version 1: a frame type is sent only on a
#: stream whose negotiated version has it, and a decoder of an older stream refuses it as an unknown type
FRAME_VERSIONS = {T_PING: 2, T_PONG: 2, T_RESTORE: 2, T_RESTORED: 2}

_HEAD = struct.Struct(">IB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_ROW = struct.Struct(">16sqHqI")  # a message of a T_MESSAGES_ROWS frame: id, timestamp, attempts, due, length
_ID_LENGTH = 16
#: bytes per message of the fixed-size columns of a MESSAGES frame: id, timestamp, attempts, due time
_FIXED_COLUMNS = _ID_LENGTH + 8 + 2 + 8


# -- events ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    node: str
    session: str
    epoch: int = 0
    durable: bool = False
    version: int = 1  # the newest protocol version the origin speaks (absent: 1)
    node_id: int = 0  # the origin's --node-id: message IDs are unique across nodes only if these differ
    clean: bool = False  # the origin's data directory holds every message it acknowledged (see PROTOCOL.md)
    min_version: int = 1  # the oldest it speaks (absent: 1)
    #: the origin's ``--replicate-to``, in its order: the order in which its replicas take it over (absent: unknown)
    peers: tuple[str, ...] = ()
    #: which of ``peers`` this HELLO goes to (absent: unknown)
    replica: str = ""
    #: True: the origin replaced this replica by another node (it was unreachable too long): drop what is held of
    #: the origin once the WELCOME is read (absent: a stream follows)
    release: bool | None = None


@dataclass(frozen=True, slots=True)
class Ask:
    """Asked of another replica of origin ``node`` before a takeover: what do you hold of it, and did you adopt
    it? (a connection of its own, as CONFIRM)"""

    node: str


@dataclass(frozen=True, slots=True)
class Holding:
    """The answer to ASK: whether ``node``'s stream is connected here, how many of its messages are held here,
    and how many ids of its messages adopted here follow in ADOPTED frames."""

    node: str
    connected: bool = False
    held: int = 0
    adopted: int = 0


@dataclass(frozen=True, slots=True)
class Confirm:
    """Asked of the node at ``node``: is ``session`` your replication session?"""

    node: str
    session: str


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The answer of the node that has that session (any other answers ERROR)."""

    node: str
    session: str


@dataclass(frozen=True, slots=True)
class Welcome:
    node: str
    session: str = ""
    seq: int = 0
    epoch: int = 0
    held: int = 0
    version: int = 1  # the protocol version of this stream, chosen by the replica (absent: 1)
    adopted: int = 0  # message ids of this origin adopted here that follow in ADOPTED frames
    #: the origin's topics and channels as the replica knows them, ``{topic: {"paused": bool, "channels":
    #: {channel: paused}}}``; sent to an origin whose HELLO is not ``clean`` (it may have lost its directory), else
    #: None (absent on the wire)
    topics: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ReplicatedMessage:
    id: bytes
    timestamp: int
    attempts: int
    due_ns: int  # wall-clock ns when a deferred message becomes deliverable; 0: not deferred
    body: bytes


class Messages:
    """MESSAGES: ``messages`` (``ReplicatedMessage``) of ``topic``; ``channel``, in a backfill only, names the
    channel that holds them ("": the topic, so every channel). A decoded frame splits only its ``ids`` and sums
    its body lengths (``body_bytes``) at once: the other columns are read when ``messages`` is first asked for
    (a replica stores the frame as received and needs its messages only for a takeover)."""

    __slots__ = ("seq", "topic", "ids", "body_bytes", "channel", "_messages", "_payload", "_columns")

    def __init__(self, seq: int, topic: str, messages: tuple[ReplicatedMessage, ...] = (), channel: str = "") -> None:
        self.seq = seq
        self.topic = topic
        self.channel = channel
        self._messages = tuple(messages)
        self.ids = tuple(m.id for m in self._messages)
        self.body_bytes = sum(len(m.body) for m in self._messages)
        self._payload = b""
        self._columns = 0

    @classmethod
    def _decoded(
        cls, seq: int, topic: str, channel: str, ids: tuple[bytes, ...], body_bytes: int, payload: bytes, columns: int
    ) -> Self:
        event = cls.__new__(cls)
        event.seq, event.topic, event.channel, event.ids, event.body_bytes = seq, topic, channel, ids, body_bytes
        event._messages, event._payload, event._columns = None, payload, columns
        return event

    _messages: tuple[ReplicatedMessage, ...] | None

    @property
    def messages(self) -> tuple[ReplicatedMessage, ...]:
        if self._messages is None:
            self._messages = _read_columns(self._payload, self._columns, self.ids)
            self._payload = b""
        return self._messages

    def __len__(self) -> int:
        return len(self.ids)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Messages:
            return NotImplemented
        return (self.seq, self.topic, self.channel, self.messages) == (
            other.seq,
            other.topic,
            other.channel,
            other.messages,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Messages(seq={self.seq!r}, topic={self.topic!r}, messages={self.messages!r}, channel={self.channel!r})"


class Restore(Messages):
    """RESTORE (version 2, replica to origin): copies of ``topic`` for ``channel`` that a backfill naming damaged
    queues left out; the origin puts them back into that channel. Laid out as a channel's MESSAGES frame."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not Restore:
            return NotImplemented
        return (self.topic, self.channel, self.messages) == (other.topic, other.channel, other.messages)

    def __repr__(self) -> str:
        return f"Restore(topic={self.topic!r}, channel={self.channel!r}, messages={self.messages!r})"


@dataclass(frozen=True, slots=True)
class Finished:
    seq: int
    topic: str
    channel: str
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Requeued:
    """Messages ``channel`` put back: ``entries`` are ``(id, attempts, due_ns)`` (due 0: ready at once)."""

    seq: int
    topic: str
    channel: str
    entries: tuple[tuple[bytes, int, int], ...]


@dataclass(frozen=True, slots=True)
class ChannelOp:
    seq: int
    topic: str
    channel: str  # "": the op applies to the topic
    op: int


@dataclass(frozen=True, slots=True)
class Synced:
    """The end of a backfill at ``seq``. ``damaged`` (version 2): the ``(topic, channel or "")`` queues whose
    files the origin found damaged, whose copies the replica must send back rather than drop (PROTOCOL.md)."""

    seq: int
    damaged: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Restored:
    """Version 2: the replica sent every copy it returns for the damage the SYNCED of ``seq`` named."""

    seq: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Version 2: the origin's heartbeat on an idle stream; ``clock`` is its monotonic clock in ns."""

    clock: int


@dataclass(frozen=True, slots=True)
class Pong:
    """Version 2: the replica's answer to a PING, with the PING's ``clock``: the origin's round trip to it."""

    clock: int


@dataclass(frozen=True, slots=True)
class Adopted:
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    text: str


#: every event of the protocol (``Restore`` is a ``Messages``)
Event: TypeAlias = (
    Hello
    | Welcome
    | Confirm
    | Confirmed
    | Messages
    | Finished
    | Requeued
    | ChannelOp
    | Synced
    | Restored
    | Heartbeat
    | Ack
    | Ping
    | Pong
    | Adopted
    | Ask
    | Holding
    | Error
)
#: a message as ``encode_messages`` takes it: ``(id, timestamp, attempts, due_ns, body)``
MessageRow: TypeAlias = tuple[bytes, int, int, int, bytes]
Decoder: TypeAlias = Callable[[bytes], Event]


# -- encoding ----------------------------------------------------------------------------------------------------
def _frame(frame_type: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload) + 1, frame_type) + payload


def _name(name: str) -> bytes:
    raw = name.encode("utf-8", "surrogateescape")
    return _U16.pack(len(raw)) + raw


def encode_messages(seq: int, topic: str, messages: Sequence[MessageRow], channel: str = "") -> bytes:
    """A MESSAGES frame from ``(id, timestamp, attempts, due_ns, body)`` tuples: the columns are built by one
    ``zip`` and one ``pack`` each (adopted messages, a backfill)."""
    count = len(messages)
    if not count:
        return _messages_frame(seq, topic, channel, 0, b"", b"", b"", b"", ())
    ids, timestamps, attempts, dues, bodies = zip(*messages, strict=True)
    return _messages_frame(
        seq,
        topic,
        channel,
        count,
        b"".join(ids),
        _pack_column("q", timestamps),
        _pack_column("H", attempts),
        _pack_column("q", dues),
        bodies,
    )


def encode_published(
    seq: int, topic: str, ids: list[bytes], bodies: list[bytes], timestamp: int, due_ns: int = 0
) -> bytes:
    """The MESSAGES frame of a published batch (one timestamp and due time for all, no attempt yet): the
    origin's hot path, no Python step per message (the columns are joined, repeated and packed in C)."""
    count = len(ids)
    return _messages_frame(
        seq,
        topic,
        "",
        count,
        b"".join(ids),
        _I64.pack(timestamp) * count,
        b"\0\0" * count,
        _I64.pack(due_ns) * count,
        bodies,
    )


def _pack_column(code: str, values: Sequence[int]) -> bytes:
    return struct.pack(f">{len(values)}{code}", *values)


_NAMES: dict[str, bytes] = {"": b"\0\0"}


def _cached_name(name: str) -> bytes:
    """``_name`` of a topic or channel, kept for the names that come again (a bounded number)."""
    raw = _NAMES.get(name)
    if raw is None:
        raw = _name(name)
        if len(_NAMES) < 4096:
            _NAMES[name] = raw
    return raw


def _messages_frame(
    seq: int,
    topic: str,
    channel: str,
    count: int,
    ids: bytes,
    timestamps: bytes,
    attempts: bytes,
    dues: bytes,
    bodies: Sequence[bytes],
) -> bytes:
    lengths = struct.pack(f">{count}I", *map(len, bodies))
    data = b"".join(bodies)
    topic_raw, channel_raw = _cached_name(topic), _cached_name(channel)
    size = (
        1
        + 8
        + len(topic_raw)
        + len(channel_raw)
        + 4
        + len(ids)
        + len(timestamps)
        + len(attempts)
        + len(dues)
        + len(lengths)
        + len(data)
    )
    return b"".join(
        (
            _HEAD.pack(size, T_MESSAGES),
            _U64.pack(seq),
            topic_raw,
            channel_raw,
            _U32.pack(count),
            ids,
            timestamps,
            attempts,
            dues,
            lengths,
            data,
        )
    )


def _read_columns(payload: bytes, pos: int, ids: tuple[bytes, ...]) -> tuple[ReplicatedMessage, ...]:
    """The messages of a MESSAGES payload whose columns start at ``pos`` (checked by the decoder)."""
    count = len(ids)
    if not count:
        return ()
    unpack = struct.unpack_from
    timestamps = unpack(f">{count}q", payload, pos)
    pos += 8 * count
    attempts = unpack(f">{count}H", payload, pos)
    pos += 2 * count
    dues = unpack(f">{count}q", payload, pos)
    pos += 8 * count
    lengths = unpack(f">{count}I", payload, pos)
    pos += 4 * count
    bodies = []
    for length in lengths:
        bodies.append(payload[pos : pos + length])
        pos += length
    return tuple(map(ReplicatedMessage, ids, timestamps, attempts, dues, bodies))


def _encode_json(frame_type: int, event: Hello | Welcome | Confirm | Confirmed | Ask | Holding) -> bytes:
    fields = {name: value for name in event.__slots__ if (value := getattr(event, name)) is not None}
    return _frame(frame_type, json.dumps(fields, separators=(",", ":")).encode())


def encode(event: Event) -> bytes:
    """The frame of one event."""
    if type(event) is Messages:
        return encode_messages(
            event.seq,
            event.topic,
            [(m.id, m.timestamp, m.attempts, m.due_ns, m.body) for m in event.messages],
            event.channel,
        )
    if type(event) is Finished:
        return _frame(
            T_FINISHED,
            _U64.pack(event.seq)
            + _name(event.topic)
            + _name(event.channel)
            + _U32.pack(len(event.ids))
            + b"".join(event.ids),
        )
    if type(event) is Requeued:
        return _frame(
            T_REQUEUED,
            _U64.pack(event.seq)
            + _name(event.topic)
            + _name(event.channel)
            + _U32.pack(len(event.entries))
            + b"".join(_REQUEUED_ROW.pack(*row) for row in event.entries),
        )
    if type(event) is ChannelOp:
        return _frame(T_CHANNEL, _U64.pack(event.seq) + _name(event.topic) + _name(event.channel) + bytes((event.op,)))
    if type(event) is Ack:
        return _frame(T_ACK, _U64.pack(event.seq))
    if type(event) is Synced:
        damaged = b""
        if event.damaged:
            damaged = _U32.pack(len(event.damaged)) + b"".join(_name(t) + _name(c) for t, c in event.damaged)
        return _frame(T_SYNCED, _U64.pack(event.seq) + damaged)
    if type(event) is Restored:
        return _frame(T_RESTORED, _U64.pack(event.seq))
    if type(event) is Restore:
        return encode_restore(
            event.topic, event.channel, [(m.id, m.timestamp, m.attempts, m.due_ns, m.body) for m in event.messages]
        )
    if type(event) is Heartbeat:
        return _frame(T_HEARTBEAT, b"")
    if type(event) is Ping:
        return _frame(T_PING, _U64.pack(event.clock))
    if type(event) is Pong:
        return _frame(T_PONG, _U64.pack(event.clock))
    if type(event) is Hello:
        return _encode_json(T_HELLO, event)
    if type(event) is Welcome:
        return _encode_json(T_WELCOME, event)
    if type(event) is Confirm:
        return _encode_json(T_CONFIRM, event)
    if type(event) is Confirmed:
        return _encode_json(T_CONFIRMED, event)
    if type(event) is Ask:
        return _encode_json(T_ASK, event)
    if type(event) is Holding:
        return _encode_json(T_HOLDING, event)
    if type(event) is Adopted:
        return _frame(T_ADOPTED, _U32.pack(len(event.ids)) + b"".join(event.ids))
    if type(event) is Error:
        return _frame(T_ERROR, _name(event.code) + event.text.encode("utf-8", "replace"))
    raise TypeError(f"not a replication event: {event!r}")


HEARTBEAT_FRAME = encode(Heartbeat())


def encode_restore(topic: str, channel: str, rows: Sequence[MessageRow]) -> bytes:
    """The RESTORE frame of ``rows``, ``(id, timestamp, attempts, due_ns, body)``: a channel's MESSAGES frame
    (seq 0) under its own type."""
    frame = encode_messages(0, topic, rows, channel)
    return frame[:4] + bytes((T_RESTORE,)) + frame[5:]


def frame_version(frame_type: int) -> int:
    """The protocol version that introduced ``frame_type`` (1 for the first version's frames)."""
    return FRAME_VERSIONS.get(frame_type, 1)


def negotiate(speaks: int, speaks_min: int, peer: int, peer_min: int) -> int:
    """The protocol version of a stream between a node speaking ``speaks_min``..``speaks`` and a peer speaking
    ``peer_min``..``peer``: the highest both speak. ``E_BAD_VERSION`` when the ranges do not meet."""
    version = min(speaks, peer)
    if version < max(speaks_min, peer_min):
        raise ProtocolError(
            E_BAD_VERSION,
            f"no protocol version in common: this node speaks {speaks_min}-{speaks}, the peer {peer_min}-{peer}",
        )
    return version


# -- decoding ----------------------------------------------------------------------------------------------------
#: names found valid (topics and channels: the same rule), kept for the frames that name them again
_VALID_NAMES: dict[bytes, str] = {}


class _Reader:
    """Fields of one payload, in order; running short or leaving bytes over is ``E_BAD_PROTOCOL``."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def _short(self) -> ProtocolError:
        return ProtocolError(E_BAD_PROTOCOL, f"{self.what} frame cut short")

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        end = self.pos + layout.size
        if end > len(self.data):
            raise self._short()
        values = layout.unpack_from(self.data, self.pos)
        self.pos = end
        return values

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise self._short()
        value = self.data[self.pos : end]
        self.pos = end
        return value

    def name(self, code: str, kind: str, *, allow_empty: bool = False) -> str:
        raw = self.take(self.unpack(_U16)[0])
        if allow_empty and not raw:
            return ""
        text = _VALID_NAMES.get(raw)
        if text is not None:
            return text
        text = raw.decode("utf-8", "surrogateescape")
        if not is_valid_name_bytes(raw) or is_ephemeral(text):
            shown = raw.decode("utf-8", "backslashreplace")
            raise ProtocolError(code, f"replicated {kind} name {shown!r} is not valid")
        if len(_VALID_NAMES) < 4096:
            _VALID_NAMES[raw] = text
        return text

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(E_BAD_PROTOCOL, f"{self.what} frame has {len(self.data) - self.pos} extra byte(s)")


def _json_object(payload: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise ProtocolError(E_BAD_HELLO, f"{what} is not a JSON object")
    return value


def _field(obj: dict[str, Any], name: str, kind: type, default: object, what: str) -> Any:
    value = obj.get(name, default)
    if kind is int and (type(value) is not int or value < 0):
        raise ProtocolError(E_BAD_HELLO, f"{what} field {name!r} must be a non-negative integer")
    if kind is str and type(value) is not str:
        raise ProtocolError(E_BAD_HELLO, f"{what} field {name!r} must be a string")
    if kind is bool and type(value) is not bool:
        raise ProtocolError(E_BAD_HELLO, f"{what} field {name!r} must be true or false")
    return value


def _decode_hello(payload: bytes) -> Hello:
    obj = _json_object(payload, "HELLO")
    node = _field(obj, "node", str, "", "HELLO")
    host, _, port = node.rpartition(":")
    if not host or not port.isdigit():
        raise ProtocolError(E_BAD_HELLO, f"HELLO node {node!r} is not HOST:PORT")
    return Hello(
        node=node,
        session=_field(obj, "session", str, "", "HELLO"),
        epoch=_field(obj, "epoch", int, 0, "HELLO"),
        durable=_field(obj, "durable", bool, False, "HELLO"),
        version=_field(obj, "version", int, 1, "HELLO"),
        node_id=_field(obj, "node_id", int, 0, "HELLO"),
        clean=_field(obj, "clean", bool, False, "HELLO"),
        min_version=_field(obj, "min_version", int, 1, "HELLO"),
        peers=_peers(obj.get("peers", [])),
        replica=_field(obj, "replica", str, "", "HELLO"),
        release=_field(obj, "release", bool, False, "HELLO") or None,
    )


def _peers(value: object) -> tuple[str, ...]:
    if type(value) is not list or not all(type(peer) is str for peer in value):
        raise ProtocolError(E_BAD_HELLO, "HELLO field 'peers' must be a list of strings")
    return tuple(value)


def _decode_ask(payload: bytes) -> Ask:
    return Ask(node=_field(_json_object(payload, "ASK"), "node", str, "", "ASK"))


def _decode_holding(payload: bytes) -> Holding:
    obj = _json_object(payload, "HOLDING")
    return Holding(
        node=_field(obj, "node", str, "", "HOLDING"),
        connected=_field(obj, "connected", bool, False, "HOLDING"),
        held=_field(obj, "held", int, 0, "HOLDING"),
        adopted=_field(obj, "adopted", int, 0, "HOLDING"),
    )


def _decode_identity(event_type: type[Confirm | Confirmed]) -> Decoder:
    what = event_type.__name__.upper()

    def decode(payload: bytes) -> Confirm | Confirmed:
        obj = _json_object(payload, what)
        return event_type(node=_field(obj, "node", str, "", what), session=_field(obj, "session", str, "", what))

    return decode


def _decode_welcome(payload: bytes) -> Welcome:
    obj = _json_object(payload, "WELCOME")
    return Welcome(
        node=_field(obj, "node", str, "", "WELCOME"),
        session=_field(obj, "session", str, "", "WELCOME"),
        seq=_field(obj, "seq", int, 0, "WELCOME"),
        epoch=_field(obj, "epoch", int, 0, "WELCOME"),
        held=_field(obj, "held", int, 0, "WELCOME"),
        version=_field(obj, "version", int, 1, "WELCOME"),
        adopted=_field(obj, "adopted", int, 0, "WELCOME"),
        topics=_decode_topology(obj.get("topics")),
    )


def _decode_topology(value: object) -> dict[str, Any] | None:
    """WELCOME's ``topics``: valid names of lasting topics and channels, paused flags true or false."""
    if value is None:
        return None

    def valid(name: object, paused: object) -> bool:
        return (
            type(name) is str and is_valid_name_bytes(name.encode()) and not is_ephemeral(name) and type(paused) is bool
        )

    if not isinstance(value, dict):
        raise ProtocolError(E_BAD_HELLO, "WELCOME field 'topics' must be an object")
    for name, topic in value.items():
        channels = topic.get("channels", {}) if isinstance(topic, dict) else None
        if (
            not isinstance(channels, dict)
            or not valid(name, topic.get("paused", False))
            or not all(valid(c, paused) for c, paused in channels.items())
        ):
            raise ProtocolError(E_BAD_HELLO, f"WELCOME field 'topics' has a bad entry for {name!r}")
    return value


def _decode_messages(payload: bytes) -> Messages:
    reader = _Reader(payload, "MESSAGES")
    seq = reader.unpack(_U64)[0]
    topic = reader.name(E_BAD_TOPIC, "topic")
    channel = reader.name(E_BAD_CHANNEL, "channel", allow_empty=True)
    count = reader.unpack(_U32)[0]
    columns = reader.pos
    lengths_at = columns + count * _FIXED_COLUMNS
    bodies_at = lengths_at + 4 * count
    if bodies_at > len(payload):
        raise reader._short()
    body_bytes = sum(struct.unpack_from(f">{count}I", payload, lengths_at)) if count else 0
    if bodies_at + body_bytes > len(payload):
        raise reader._short()
    reader.pos = bodies_at + body_bytes
    reader.end()
    return Messages._decoded(
        seq, topic, channel, split_ids(payload, columns, count), body_bytes, payload, columns + _ID_LENGTH * count
    )


def _decode_synced(payload: bytes) -> Synced:
    reader = _Reader(payload, "SYNCED")
    seq = reader.unpack(_U64)[0]
    if reader.pos == len(payload):
        return Synced(seq)
    damaged = []
    for _ in range(reader.unpack(_U32)[0]):
        topic = reader.name(E_BAD_TOPIC, "topic")
        damaged.append((topic, reader.name(E_BAD_CHANNEL, "channel", allow_empty=True)))
    reader.end()
    return Synced(seq, tuple(damaged))


def _decode_restore(payload: bytes) -> Restore:
    event = _decode_messages(payload)
    if not event.channel:
        raise ProtocolError(E_BAD_PROTOCOL, "RESTORE frame without a channel")
    return Restore._decoded(0, event.topic, event.channel, event.ids, event.body_bytes, payload, event._columns)


def _decode_message_rows(payload: bytes) -> Messages:
    reader = _Reader(payload, "MESSAGES")
    seq = reader.unpack(_U64)[0]
    topic = reader.name(E_BAD_TOPIC, "topic")
    messages = []
    for _ in range(reader.unpack(_U32)[0]):
        msg_id, timestamp, attempts, due_ns, length = reader.unpack(_ROW)
        messages.append(ReplicatedMessage(msg_id, timestamp, attempts, due_ns, reader.take(length)))
    reader.end()
    return Messages(seq, topic, tuple(messages))


def _channel_frame_head(payload: bytes, what: str) -> tuple[_Reader, int, str, str, int]:
    """The fields FINISHED and REQUEUED open with: seq, topic, channel, count (the reader past them)."""
    reader = _Reader(payload, what)
    seq = reader.unpack(_U64)[0]
    topic = reader.name(E_BAD_TOPIC, "topic")
    channel = reader.name(E_BAD_CHANNEL, "channel")
    return reader, seq, topic, channel, reader.unpack(_U32)[0]


def _decode_finished(payload: bytes) -> Finished:
    reader, seq, topic, channel, count = _channel_frame_head(payload, "FINISHED")
    start = reader.pos
    reader.take(count * _ID_LENGTH)
    reader.end()
    return Finished(seq, topic, channel, split_ids(payload, start, count))


def _decode_requeued(payload: bytes) -> Requeued:
    reader, seq, topic, channel, count = _channel_frame_head(payload, "REQUEUED")
    rows = reader.take(count * _REQUEUED_ROW.size)
    reader.end()
    return Requeued(seq, topic, channel, tuple(_REQUEUED_ROW.iter_unpack(rows)))


_ID_STRUCTS: dict[int, struct.Struct] = {}


def split_ids(data: bytes, pos: int, count: int) -> tuple[bytes, ...]:
    """``count`` 16-byte message IDs stored back to back from ``pos``, in one C call (a ``Struct`` of that many
    IDs, kept for the counts that come again)."""
    layout = _ID_STRUCTS.get(count)
    if layout is None:
        layout = struct.Struct(f"{_ID_LENGTH}s" * count)
        if len(_ID_STRUCTS) < 64 and count <= 8192:
            _ID_STRUCTS[count] = layout
    return layout.unpack_from(data, pos)


def _decode_adopted(payload: bytes) -> Adopted:
    reader = _Reader(payload, "ADOPTED")
    raw = reader.take(reader.unpack(_U32)[0] * _ID_LENGTH)
    reader.end()
    return Adopted(tuple(raw[i : i + _ID_LENGTH] for i in range(0, len(raw), _ID_LENGTH)))


def _decode_channel(payload: bytes) -> ChannelOp:
    reader = _Reader(payload, "CHANNEL")
    seq = reader.unpack(_U64)[0]
    topic = reader.name(E_BAD_TOPIC, "topic")
    channel = reader.name(E_BAD_CHANNEL, "channel", allow_empty=True)
    op = reader.take(1)[0]
    reader.end()
    if op not in _OPS or (not channel and op in (OP_EMPTIED, OP_LOG)):
        raise ProtocolError(E_BAD_PROTOCOL, f"CHANNEL frame with unknown op {op}")
    return ChannelOp(seq, topic, channel, op)


def _decode_seq(event_type: type[Ack | Ping | Pong | Restored]) -> Decoder:
    def decode(payload: bytes) -> Ack | Ping | Pong | Restored:
        reader = _Reader(payload, event_type.__name__.upper())
        seq = reader.unpack(_U64)[0]
        reader.end()
        return event_type(seq)

    return decode


def _decode_heartbeat(payload: bytes) -> Heartbeat:
    if payload:
        raise ProtocolError(E_BAD_PROTOCOL, "HEARTBEAT frame with a payload")
    return Heartbeat()


def _decode_error(payload: bytes) -> Error:
    reader = _Reader(payload, "ERROR")
    code = reader.take(reader.unpack(_U16)[0]).decode("utf-8", "replace")
    return Error(code, payload[reader.pos :].decode("utf-8", "replace"))


_DECODERS: dict[int, Decoder] = {
    T_HELLO: _decode_hello,
    T_MESSAGES: _decode_messages,
    T_MESSAGES_ROWS: _decode_message_rows,
    T_FINISHED: _decode_finished,
    T_CHANNEL: _decode_channel,
    T_HEARTBEAT: _decode_heartbeat,
    T_SYNCED: _decode_synced,
    T_WELCOME: _decode_welcome,
    T_ACK: _decode_seq(Ack),
    T_ERROR: _decode_error,
    T_ADOPTED: _decode_adopted,
    T_CONFIRM: _decode_identity(Confirm),
    T_CONFIRMED: _decode_identity(Confirmed),
    T_ASK: _decode_ask,
    T_HOLDING: _decode_holding,
    T_REQUEUED: _decode_requeued,
    T_PING: _decode_seq(Ping),
    T_PONG: _decode_seq(Pong),
    T_RESTORE: _decode_restore,
    T_RESTORED: _decode_seq(Restored),
}


class ReplicationDecoder(InputBuffer):
    """Incremental reader of replication frames: ``receive_data(bytes)``, then ``next_event()`` until None.

    A size of 0 or over ``max_frame_size``, an unknown frame type or a malformed payload raises
    ``ProtocolError``; names are checked as NSQ names (``E_BAD_TOPIC``, ``E_BAD_CHANNEL``). ``last_frame`` holds
    the whole frame of the last event returned (a replica stores it as received). ``version``: the protocol
    version of the stream (set once HELLO and WELCOME agreed on it); a frame type of a later version is refused
    as unknown, as a node of that version would."""

    __slots__ = ("_max_frame_size", "last_frame", "version")

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024, version: int = PROTOCOL_VERSION) -> None:
        super().__init__()
        self._max_frame_size = max_frame_size
        self.last_frame = b""
        self.version = version

    def next_event(self) -> Event | None:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 5:
            self._need = 5
            return None
        size, frame_type = _HEAD.unpack_from(buf, pos)
        if size < 1 or size > self._max_frame_size:
            raise ProtocolError(E_BAD_PROTOCOL, f"invalid replication frame size {size}")
        decode = _DECODERS.get(frame_type)
        if decode is None or (frame_type in FRAME_VERSIONS and FRAME_VERSIONS[frame_type] > self.version):
            raise ProtocolError(
                E_BAD_PROTOCOL, f"unknown replication frame type {frame_type:#04x} (protocol version {self.version})"
            )
        end = pos + 4 + size
        if end > len(buf):
            self._need = 4 + size
            return None
        self._pos = end
        self._need = 0
        event = decode(buf[pos + 5 : end])
        if type(event) is Synced and event.damaged and self.version < 2:
            raise ProtocolError(E_BAD_PROTOCOL, f"SYNCED frame naming damaged queues (protocol version {self.version})")
        if type(event) is ChannelOp and OP_VERSIONS.get(event.op, 1) > self.version:
            raise ProtocolError(
                E_BAD_PROTOCOL, f"CHANNEL frame with unknown op {event.op} (protocol version {self.version})"
            )
        self.last_frame = buf[pos:end]
        return event

    def buffered_size(self) -> int:
        return len(self._buf) - self._pos + self._chunks_len
