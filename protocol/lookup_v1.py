"""The ``  V1`` protocol between nsqd and nsqlookupd, without I/O.

Wire format (client → lookupd): the 4-byte magic ``"  V1"``, then command lines ending in ``\\n``.
Each line is trimmed of surrounding whitespace (Go's ``strings.TrimSpace``) and split on single
spaces, so two spaces make an empty parameter. Commands::

    PING\\n
    IDENTIFY\\n[int32 size][JSON peer info]
    REGISTER <topic> [<channel>]\\n
    UNREGISTER <topic> [<channel>]\\n

Responses (lookupd → client) carry no frame type, only a size: ``[int32 size][bytes]``. Success is
``OK`` (IDENTIFY answers lookupd's own JSON), failure the text ``<CODE> <description>``. Every error
is fatal: lookupd sends it and closes the connection.

``ServerProtocol`` is lookupd's side as a state machine in h11's style: ``receive_data(bytes)``
(``b""`` at end of input), then ``next_event()`` returns ``Ping``, ``Identify``, ``Register``,
``Unregister``, ``NEED_DATA`` or ``CLOSED``, and raises ``ProtocolError`` with NSQ's exact text, in
NSQ's order (IDENTIFY twice fails before its body is read; REGISTER before IDENTIFY fails before
its names are checked). It also checks the magic (``E_BAD_PROTOCOL``).

Limits NSQ does not have: a line may hold at most ``max_line_length`` bytes (``LineTooLong``: the
connection is dropped without an answer, as nsqd does for V2), and an IDENTIFY body may declare at
most ``max_identify_body`` bytes (``E_BAD_BODY IDENTIFY failed to read body``, what NSQ answers
when the declared body never arrives). NSQ reads both without bound; its peers send a few hundred
bytes.

The client side (nsqd) uses the ``encode_*`` functions, ``ResponseDecoder`` and
``parse_lookupd_info``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, TypeAlias

from .errors import E_BAD_BODY, E_BAD_CHANNEL, E_BAD_PROTOCOL, E_BAD_TOPIC, E_INVALID, LineTooLong, ProtocolError
from .http import go_json
from .names import decode_name, encode_name, is_valid_channel_name, is_valid_topic_name

__all__ = [
    "CLOSED",
    "MAGIC_V1",
    "NEED_DATA",
    "OK",
    "PING",
    "Identify",
    "LookupdInfo",
    "PeerFields",
    "Ping",
    "Register",
    "ResponseDecoder",
    "ServerProtocol",
    "Unregister",
    "decode_peer_info",
    "encode_identify",
    "encode_identify_response",
    "encode_register",
    "encode_response",
    "encode_unregister",
    "go_trim_space",
    "parse_lookupd_info",
]

MAGIC_V1 = b"  V1"
PING = b"PING\n"
OK = b"OK"

DEFAULT_MAX_LINE_LENGTH = 64 * 1024
DEFAULT_MAX_IDENTIFY_BODY = 1024 * 1024

_int32 = struct.Struct(">i")

# Go's unicode.IsSpace: the Latin-1 spaces and the Unicode White_Space characters.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def go_trim_space(text: str) -> str:
    """Go's ``strings.TrimSpace`` (Python's ``str.strip()`` also strips ``\\x1c``-``\\x1f``, Go does not)."""
    return text.strip(_GO_SPACE)


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
CLOSED = _Sentinel("CLOSED")


# -- events ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PeerFields:
    """What an nsqd says about itself in IDENTIFY (lookupd adds the remote address it sees)."""

    broadcast_address: str
    hostname: str
    tcp_port: int
    http_port: int
    version: str


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Identify:
    peer: PeerFields


@dataclass(frozen=True, slots=True)
class Register:
    topic: str
    channel: str  # "" for a topic registration


@dataclass(frozen=True, slots=True)
class Unregister:
    topic: str
    channel: str  # "" for a topic unregistration


# -- IDENTIFY body ---------------------------------------------------------------------------------------------
#: what ``ServerProtocol.next_event`` returns
Event: TypeAlias = Ping | Identify | Register | Unregister | _Sentinel

_STRING_FIELDS = ("remote_address", "hostname", "broadcast_address", "version")
_INT_FIELDS = ("tcp_port", "http_port")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class _OutOfRange:
    """An integer literal too long for int64 (kept aside so ignored fields may still hold one)."""


def _parse_int(text: str) -> Any:
    return int(text) if len(text) <= 20 else _OutOfRange()


def _reject_constant(text: str) -> Any:
    raise ValueError(f"invalid JSON value {text}")


def _fold(key: str) -> str:
    # Go matches struct fields case-insensitively with simple Unicode folding (K = Kelvin sign, ſ = s).
    return key.lower().replace("\u017f", "s")


_FIELD_BY_FOLDED = {_fold(name): name for name in (*_STRING_FIELDS, *_INT_FIELDS)}


def decode_peer_info(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body as Go's ``json.Unmarshal`` fills lookupd's peer struct.

    Returns the known fields found (keys matched case-insensitively, the last occurrence wins,
    ``null`` leaves a field unset, unknown keys are ignored). Raises ``ValueError`` for anything Go
    rejects: malformed JSON, a top level other than an object or ``null``, a string field holding
    a non-string, an integer field holding a non-integer or a value beyond int64.
    """
    try:
        value = json.loads(body.decode("utf-8", "replace"), parse_int=_parse_int, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("exceeded max depth") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"cannot unmarshal {type(value).__name__} into peer info")
    fields: dict[str, Any] = {}
    problem = None
    for key, item in value.items():
        name = key if key in _FIELD_BY_FOLDED.values() else _FIELD_BY_FOLDED.get(_fold(key))
        if name is None or item is None:
            continue
        if name in _STRING_FIELDS:
            if isinstance(item, str):
                fields[name] = item
            else:
                problem = problem or f"{name} is not a string"
        elif isinstance(item, int) and not isinstance(item, bool) and _INT64_MIN <= item <= _INT64_MAX:
            fields[name] = item
        else:
            problem = problem or f"{name} is not an integer"
    if problem is not None:
        raise ValueError(problem)
    return fields


# -- lookupd's side --------------------------------------------------------------------------------------------
_MAGIC, _LINE, _BODY_SIZE, _BODY, _DONE = range(5)


class ServerProtocol:
    """One connection as lookupd sees it (see the module notes).

    ``identified`` turns true when an ``Identify`` event is returned. ``magic`` holds the four
    bytes the client opened with, once received. After an error every call raises it again.
    """

    __slots__ = (
        "_buf",
        "_eof",
        "_state",
        "_size",
        "_error",
        "identified",
        "magic",
        "max_line_length",
        "max_identify_body",
    )

    def __init__(
        self,
        *,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        max_identify_body: int = DEFAULT_MAX_IDENTIFY_BODY,
        expect_magic: bool = True,
    ) -> None:
        self._buf = bytearray()
        self._eof = False
        self._state = _MAGIC if expect_magic else _LINE
        self._size = 0
        self._error: Exception | None = None
        self.identified = False
        self.magic: bytes | None = None if expect_magic else MAGIC_V1
        self.max_line_length = max_line_length
        self.max_identify_body = max_identify_body

    def receive_data(self, data: bytes) -> None:
        if data:
            self._buf += data
        else:
            self._eof = True

    @property
    def magic_pending(self) -> bool:
        """True until the 4-byte magic has been received."""
        return self._state == _MAGIC

    def next_event(self) -> Event:
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except (ProtocolError, LineTooLong) as exc:
            self._state = _DONE
            self._error = exc
            raise

    def _next(self) -> Event:
        buf = self._buf
        state = self._state
        if state == _MAGIC:
            if len(buf) < 4:
                return CLOSED if self._eof else NEED_DATA
            self.magic = bytes(buf[:4])
            del buf[:4]
            if self.magic != MAGIC_V1:
                raise ProtocolError(E_BAD_PROTOCOL)
            state = self._state = _LINE
        if state == _LINE:
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > self.max_line_length:
                    raise LineTooLong(self.max_line_length)
                return CLOSED if self._eof else NEED_DATA
            if end + 1 > self.max_line_length:
                raise LineTooLong(self.max_line_length)
            line = decode_name(bytes(buf[:end]))
            del buf[: end + 1]
            params = go_trim_space(line).split(" ")
            name = params[0]
            if name == "PING":
                return Ping()
            if name == "IDENTIFY":
                if self.identified:
                    raise ProtocolError(E_INVALID, "cannot IDENTIFY again")
                state = self._state = _BODY_SIZE
            elif name in ("REGISTER", "UNREGISTER"):
                if not self.identified:
                    raise ProtocolError(E_INVALID, "client must IDENTIFY")
                topic, channel = _topic_channel(name, params[1:])
                return Register(topic, channel) if name == "REGISTER" else Unregister(topic, channel)
            else:
                raise ProtocolError(E_INVALID, f"invalid command {name}")
        if state == _BODY_SIZE:
            if len(buf) < 4:
                if self._eof:
                    raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to read body size")
                return NEED_DATA
            size = _int32.unpack_from(buf)[0]
            del buf[:4]
            if size < 0:
                raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to read body size")
            if size > self.max_identify_body:
                raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to read body")
            self._size = size
            state = self._state = _BODY
        if state == _BODY:
            size = self._size
            if len(buf) < size:
                if self._eof:
                    raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to read body")
                return NEED_DATA
            body = bytes(buf[:size])
            del buf[:size]
            self._state = _LINE
            try:
                fields = decode_peer_info(body)
            except ValueError:
                raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body") from None
            peer = PeerFields(
                fields.get("broadcast_address", ""),
                fields.get("hostname", ""),
                fields.get("tcp_port", 0),
                fields.get("http_port", 0),
                fields.get("version", ""),
            )
            if not peer.broadcast_address or not peer.tcp_port or not peer.http_port or not peer.version:
                raise ProtocolError(E_BAD_BODY, "IDENTIFY missing fields")
            self.identified = True
            return Identify(peer)
        raise AssertionError(f"bad state {state}")


def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
    if not params:
        raise ProtocolError(E_INVALID, f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_topic_name(topic):
        raise ProtocolError(E_BAD_TOPIC, f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_channel_name(channel):
        raise ProtocolError(E_BAD_CHANNEL, f"{command} channel name '{channel}' is not valid")
    return topic, channel


def encode_response(data: bytes) -> bytes:
    """A lookupd response: ``[int32 size][data]``."""
    return _int32.pack(len(data)) + data


def encode_identify_response(
    *, broadcast_address: str, hostname: str, http_port: int, tcp_port: int, version: str
) -> bytes:
    """The JSON lookupd answers IDENTIFY with (keys sorted, as Go marshals a map), without the size."""
    return go_json(
        {
            "broadcast_address": broadcast_address,
            "hostname": hostname,
            "http_port": http_port,
            "tcp_port": tcp_port,
            "version": version,
        }
    )


# -- nsqd's side -----------------------------------------------------------------------------------------------
def encode_identify(*, broadcast_address: str, hostname: str, http_port: int, tcp_port: int, version: str) -> bytes:
    """IDENTIFY with nsqd's peer info (keys sorted, as Go marshals a map)."""
    body = go_json(
        {
            "broadcast_address": broadcast_address,
            "hostname": hostname,
            "http_port": http_port,
            "tcp_port": tcp_port,
            "version": version,
        }
    )
    return b"IDENTIFY\n" + _int32.pack(len(body)) + body


def _names_line(command: bytes, topic: str, channel: str) -> bytes:
    line = command + b" " + encode_name(topic)
    if channel:
        line += b" " + encode_name(channel)
    return line + b"\n"


def encode_register(topic: str, channel: str = "") -> bytes:
    return _names_line(b"REGISTER", topic, channel)


def encode_unregister(topic: str, channel: str = "") -> bytes:
    return _names_line(b"UNREGISTER", topic, channel)


class ResponseDecoder:
    """nsqd reading lookupd's answers: ``receive_data`` then ``next_response()`` (None: need more).

    A size over ``max_size`` (nsqd's ``--max-body-size``) or below zero raises ``ProtocolError``;
    the connection must then be dropped.
    """

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = 5242880) -> None:
        self._buf = bytearray()
        self.max_size = max_size

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def next_response(self) -> bytes | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        size = _int32.unpack_from(buf)[0]
        if size < 0 or size > self.max_size:
            raise ProtocolError(E_BAD_PROTOCOL, f"response body size ({size}) is greater than limit ({self.max_size})")
        if len(buf) < 4 + size:
            return None
        data = bytes(buf[4 : 4 + size])
        del buf[: 4 + size]
        return data

    def buffered_size(self) -> int:
        return len(self._buf)


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """What a lookupd says about itself in its IDENTIFY answer."""

    tcp_port: int
    http_port: int
    version: str
    broadcast_address: str


def parse_lookupd_info(data: bytes) -> LookupdInfo:
    """Decode lookupd's IDENTIFY answer; ``ValueError`` when it is not the JSON object nsqd expects."""
    value = json.loads(data.decode("utf-8", "replace"), parse_constant=_reject_constant)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    folded = {_fold(key): item for key, item in value.items()}

    def get(name: str, kind: type, default: Any) -> Any:
        item = folded.get(name)
        if item is None:
            return default
        if not isinstance(item, kind) or isinstance(item, bool):
            raise ValueError(f"{name} has the wrong type")
        return item

    return LookupdInfo(
        get("tcp_port", int, 0), get("http_port", int, 0), get("version", str, ""), get("broadcast_address", str, "")
    )
