"""The client side of NSQ's V2 protocol, sans I/O: bytes in, events out, bytes to send.

Both drivers run this one state machine: the trio ``Connection`` (``trionsq._connection``) and the
blocking one (``trionsq.blocking``). It never touches a socket, a clock or an event loop; it decides
what the connection is to do next and the driver does it.

A connection's life, in the order go-nsq and pynsq follow::

    magic "  V2" + IDENTIFY  ->  IDENTIFY response (JSON Features, or "OK" from a server without
    feature negotiation)  ->  [TLS handshake, then "OK" over TLS]  ->  [deflate or snappy: both
    directions switch at once, then a compressed "OK"]  ->  [AUTH <secret>, JSON answer]  ->
    connected: commands out, frames in

How a driver uses it
--------------------

::

    core = ClientCore(config, "host:port", responder=conn)   # responder: see trionsq._message
    write(core.handshake_bytes())                 # magic + IDENTIFY, plain bytes
    while True:                                   # the handshake
        event = core.next_event()
        if event is NEED_DATA:
            data = read()                         # b"" at EOF -> raise ConnectError
            core.receive_data(data)
        elif event is START_TLS:                  # wrap the socket in TLS (server_hostname from the
            tls_handshake()                       # address; context config.ssl_context()), then:
            core.tls_started()                    # later reads/writes go through TLS
        elif type(event) is Send:
            write(event.data)                     # already wire bytes (AUTH, compressed if need be)
        elif type(event) is Connected:
            break                                 # event.features, event.auth; core.features too

    # connected: every outgoing byte passes through core.wire_bytes() (compression), in order
    write(core.wire_bytes(encode_pub(topic, body)));  core.expect_reply(token)
    ...
    core.receive_data(read())
    while (event := core.next_event()) is not NEED_DATA:    # or: for event in core.receive_events(read())
        type(event) is Message    -> hand it to the consumer (its finish()/requeue()/touch() call
                                     the responder, which queues core.wire_bytes(data) for writing)
        event is HEARTBEAT        -> write(core.wire_bytes(NOP))
        type(event) is Reply      -> event.token is what expect_reply() got for the oldest
                                     command still waiting; event.data e.g. b"OK", b"CLOSE_WAIT"
        type(event) is ErrorReply -> event.error (NSQError); event.token as for Reply, or None for
                                     E_FIN_FAILED/E_REQ_FAILED/E_TOUCH_FAILED, which answer no
                                     waiting command. error.fatal: nsqd closes the connection

``receive_events(data)`` is the batch form of ``receive_data`` + ``next_event`` for a connected
driver: every frame the read completes is decoded in one pass into a list (a read of a consumer at
RDY 200 holds hundreds of messages; one call per frame, one ``Frame`` tuple per frame and a state
check per frame are what it saves). A driver uses one form or the other once connected, not both.

Rules the driver keeps:

- ``expect_reply(token)`` once per command that nsqd answers (PUB, MPUB, DPUB, SUB, CLS, and
  IDENTIFY/AUTH are the core's own), in the order the commands are written; RDY, FIN, REQ, TOUCH
  and NOP get no reply. Writes may be batched: ``wire_bytes(b"".join(commands))`` once per flush
  (one compressed chunk per flush, which is also what makes compression cheap).
- ``receive_data`` takes what the transport read (after TLS, before decompression); ``b""`` is
  never passed (EOF is the driver's business: fail ``pending_tokens()`` with ``ConnectionClosed``).
- Exceptions: ``NSQError`` for an error frame during the handshake (E_IDENTIFY_FAILED,
  E_AUTH_FAILED...), ``ConnectError`` for an impossible handshake (unexpected answer, auth required
  without ``auth_secret``), ``ConnectionClosed`` for a corrupt stream at any time (bad frame size,
  bad compressed data, unknown frame type). After any of them the connection is to be dropped.

Compression and TLS upgrades change the byte stream mid-read, so whatever the frame decoder holds
past the frame that ends a step is taken back (``take_unparsed``) and re-fed through the new layer:
bytes of a compressed "OK" that arrived in the same read as the IDENTIFY response are not lost.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from protocol.commands import MAGIC_V2, encode_auth, encode_identify
from protocol.compression import (
    CompressionError,
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
)
from protocol.errors import E_BAD_TOPIC, NON_FATAL_CODES, ProtocolError
from protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder
from protocol.message import MESSAGE_HEADER_SIZE
from protocol.names import go_quote, is_valid_topic_name

from ._config import Config
from ._errors import ConnectError, ConnectionClosed, NSQError
from ._message import Message

__all__ = [
    "HEARTBEAT",
    "NEED_DATA",
    "START_TLS",
    "AuthResult",
    "ClientCore",
    "Connected",
    "ErrorReply",
    "Features",
    "Reply",
    "Send",
    "check_topic",
    "identify_body",
    "local_host",
    "split_address",
]


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA = _Sentinel("NEED_DATA")
"""``next_event()``: nothing more can be decoded until ``receive_data``."""
START_TLS = _Sentinel("START_TLS")
"""``next_event()`` during the handshake: do the TLS handshake now, then call ``tls_started()``."""
HEARTBEAT = _Sentinel("HEARTBEAT")
"""``next_event()``: nsqd sent ``_heartbeat_``; answer with NOP."""

_HEARTBEAT_DATA = b"_heartbeat_"
_MAX_FRAME_SIZE = 64 * 1024 * 1024  # as FrameDecoder's default
_MESSAGE_FRAME_MIN = 4 + MESSAGE_HEADER_SIZE  # a message frame's size field: type + header (+ body)
_unpack_frame_header = struct.Struct(">ii").unpack_from
_unpack_message_header = struct.Struct(">qH16s").unpack_from

# Names already checked: a producer repeats the same few topics endlessly.
_valid_topics: set[str] = set()


def check_topic(command: str, topic: str) -> str:
    """``topic`` if nsqd would take it, else ``NSQError(E_BAD_TOPIC)`` with nsqd's own text. Checked
    on the client because a space in the name would split the command line and publish to the
    name's first word."""
    if topic in _valid_topics:
        return topic
    if not is_valid_topic_name(topic):
        raise NSQError(E_BAD_TOPIC, f"{command} topic name {go_quote(topic)} is not valid")
    if len(_valid_topics) > 10_000:
        _valid_topics.clear()
    _valid_topics.add(topic)
    return topic


@dataclass(frozen=True)
class Features:
    """What nsqd granted in its IDENTIFY response (``Connection.features``, ``BlockingConnection.features``).

    Times are in seconds. ``feature_negotiation`` is False when the server answered a bare ``OK``, and the rest
    are then the defaults.

    Attributes:
        feature_negotiation: nsqd answered with JSON.
        version: nsqd's version (``1.3.0`` for NSQ's nsqd and for trionsq's).
        max_rdy_count: The largest RDY count nsqd accepts (``--max-rdy-count``).
        msg_timeout: How long nsqd waits for an answer before it requeues a message.
        max_msg_timeout: The largest ``msg_timeout`` a client may ask for.
        tls_v1: The connection upgrades to TLS.
        snappy: The connection is snappy-compressed.
        deflate: The connection is deflate-compressed, at ``deflate_level``.
        deflate_level: The deflate level in use.
        max_deflate_level: The highest deflate level nsqd allows.
        sample_rate: The share of messages (percent) nsqd delivers to this connection; 0: all.
        auth_required: nsqd requires AUTH before other commands.
        output_buffer_size: nsqd's output buffer for this connection, in bytes.
        output_buffer_timeout: How often nsqd flushes that buffer.
    """

    feature_negotiation: bool = False
    version: str = ""
    max_rdy_count: int = 2500
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    max_deflate_level: int = 6
    sample_rate: int = 0
    auth_required: bool = False
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25

    @classmethod
    def from_response(cls, data: bytes) -> Features:
        """Parse the IDENTIFY response.

        Raises:
            ConnectError: The response is neither JSON nor ``OK``.
        """
        if not data.startswith(b"{"):
            return cls()  # a server without feature negotiation answers "OK", as go-nsq accepts
        try:
            obj = json.loads(data)
            return cls(
                feature_negotiation=True,
                version=str(obj.get("version", "")),
                max_rdy_count=int(obj.get("max_rdy_count", 2500)),
                msg_timeout=int(obj.get("msg_timeout", 60000)) / 1000,
                max_msg_timeout=int(obj.get("max_msg_timeout", 900000)) / 1000,
                tls_v1=bool(obj.get("tls_v1", False)),
                snappy=bool(obj.get("snappy", False)),
                deflate=bool(obj.get("deflate", False)),
                deflate_level=int(obj.get("deflate_level", 6)),
                max_deflate_level=int(obj.get("max_deflate_level", 6)),
                sample_rate=int(obj.get("sample_rate", 0)),
                auth_required=bool(obj.get("auth_required", False)),
                output_buffer_size=int(obj.get("output_buffer_size", 16384)),
                output_buffer_timeout=int(obj.get("output_buffer_timeout", 250)) / 1000,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConnectError(f"invalid IDENTIFY response from nsqd: {data[:200]!r} ({exc})") from None


@dataclass(frozen=True)
class AuthResult:
    """nsqd's answer to AUTH: the auth server's identity and how many permissions it granted.

    Attributes:
        identity: The identity the auth server gave the secret.
        identity_url: A URL about that identity, when the auth server gives one.
        permission_count: How many topic and channel permissions were granted.
    """

    identity: str = ""
    identity_url: str = ""
    permission_count: int = 0


@dataclass(slots=True)
class Send:
    """Handshake event: write ``data`` (wire bytes) to the peer."""

    data: bytes


@dataclass(slots=True)
class Connected:
    """Handshake event: the connection is ready for commands."""

    features: Features
    auth: AuthResult | None


@dataclass(slots=True)
class Reply:
    """A response frame answering the oldest waiting command.

    Attributes:
        token: What the command was sent with (``BlockingConnection.send_command``).
        data: The frame's data, e.g. ``b"OK"``.
    """

    token: Any
    data: bytes


@dataclass(slots=True)
class ErrorReply:
    """An error frame: for the oldest waiting command, or (``token`` None) for a FIN, REQ or TOUCH.

    Attributes:
        token: What the command was sent with, or None for an answer nsqd gives to a FIN, REQ or TOUCH.
        error: The error, with its code and fatal flag.
    """

    token: Any
    error: NSQError


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:4150"`` for IPv6) to (host, port); ``ValueError`` otherwise."""
    host, colon, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid nsqd address {address!r} (want host:port)")
    return host, int(port)


def local_host(local_addr: str | None) -> str | None:
    """The host part of go-nsq's ``local_addr``, the source address both drivers bind their
    connections to (the system picks the port, as trio's ``local_address`` does), or None."""
    if not local_addr:
        return None
    host = local_addr.rpartition(":")[0].strip("[]")
    return host or None


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def identify_body(config: Config) -> dict[str, Any]:
    """IDENTIFY's fields as go-nsq sends them (times in ms; -1 disables heartbeats or the output
    buffer timer, 0 leaves a value to the server)."""
    return {
        "client_id": config.effective_client_id(),
        "hostname": config.effective_hostname(),
        "user_agent": config.user_agent,
        "feature_negotiation": True,
        "tls_v1": config.tls_v1,
        "snappy": config.snappy,
        "deflate": config.deflate,
        "deflate_level": config.deflate_level,
        "heartbeat_interval": _ms(config.heartbeat_interval) if config.heartbeat_interval > 0 else -1,
        "output_buffer_size": config.output_buffer_size,
        "output_buffer_timeout": (-1 if config.output_buffer_timeout < 0 else _ms(config.output_buffer_timeout)),
        "sample_rate": config.sample_rate,
        "msg_timeout": 0 if config.msg_timeout is None else _ms(config.msg_timeout),
    }


# Handshake states, then _CONNECTED.
_INITIAL, _IDENTIFY, _TLS, _TLS_OK, _COMPRESSION_OK, _AUTH, _CONNECTED = range(7)


class ClientCore:
    """One connection's protocol state; see the module docstring for how a driver runs it."""

    __slots__ = (
        "config",
        "address",
        "responder",
        "features",
        "auth",
        "_state",
        "_frames",
        "_decoder",
        "_encoder",
        "_pending",
        "_tail",
        "_tail_size",
        "_tail_need",
    )

    def __init__(self, config: Config, address: str, responder: Any = None) -> None:
        self.config = config
        self.address = address
        self.responder = responder  # given to every Message (trionsq._message)
        self.features: Features | None = None
        self.auth: AuthResult | None = None
        self._state = _INITIAL
        self._frames = FrameDecoder()
        self._decoder: SnappyDecoder | DeflateDecoder | None = None
        self._encoder: SnappyEncoder | DeflateEncoder | None = None
        self._pending: deque[Any] = deque()
        # receive_events: the start of an incomplete frame, its size, and the size it needs
        self._tail: list[bytes] = []
        self._tail_size = 0
        self._tail_need = 0

    # -- state ------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._state == _CONNECTED

    def handshake_bytes(self) -> bytes:
        """The first bytes to send: the magic and IDENTIFY."""
        assert self._state == _INITIAL, "handshake_bytes() is called once"
        self._state = _IDENTIFY
        return MAGIC_V2 + encode_identify(identify_body(self.config))

    def tls_started(self) -> None:
        """The driver finished the TLS handshake asked for by ``START_TLS``."""
        assert self._state == _TLS, "tls_started() answers START_TLS"
        self._state = _TLS_OK

    # -- output -----------------------------------------------------------------------------------

    def wire_bytes(self, data: bytes) -> bytes:
        """Commands as they go on the wire (compressed once deflate or snappy is on). Pass a whole
        flush at once: each call is one piece of the compressed stream."""
        encoder = self._encoder
        return data if encoder is None else encoder.encode(data)

    def expect_reply(self, token: Any) -> None:
        """Register the command just written as waiting for a reply; ``token`` comes back in its
        ``Reply``/``ErrorReply``."""
        self._pending.append(token)

    def pending_tokens(self) -> list[Any]:
        """Remove and return the tokens of every command still waiting (to fail them when the
        connection ends)."""
        tokens = list(self._pending)
        self._pending.clear()
        return tokens

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # -- input ------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        """Bytes read from the transport (TLS already removed)."""
        self._frames.receive_data(data if self._decoder is None else self.decompress(data))

    def decompress(self, data: bytes | bytearray) -> bytes:
        """Transport bytes to stream bytes (identity until compression is on), for a driver that
        parses the stream itself once connected (see ``take_unparsed``)."""
        decoder = self._decoder
        if decoder is None:
            return bytes(data)  # no copy of a bytes object
        try:
            out = decoder.decode(data)
            while decoder.has_more:
                out += decoder.decode(b"")
        except CompressionError as exc:
            raise ConnectionClosed(f"corrupt compressed stream from nsqd {self.address}: {exc}") from None
        return out

    def receive_events(self, data: bytes | bytearray) -> list[Any]:
        """Connected: the events of every frame ``data`` (transport bytes) completes, in order, in
        one pass (see the module docstring); an incomplete frame is kept for the next call."""
        if self._decoder is not None:
            data = self.decompress(data)
        elif type(data) is not bytes:
            data = bytes(data)  # message bodies are slices of it
        if self._tail_need:
            self._tail.append(data)
            self._tail_size += len(data)
            if self._tail_size < self._tail_need:
                return []  # a large frame in many reads is joined once, when complete
            data = b"".join(self._tail)
            self._tail.clear()
            self._tail_need = 0
        elif self._frames.buffered_size():  # what the handshake read past its last frame
            data = self._frames.take_unparsed() + data
        events: list[Any] = []
        append = events.append
        pending = self._pending
        address = self.address
        responder = self.responder
        pos = 0
        end = len(data)
        size = 0
        while end - pos >= 8:
            size, frame_type = _unpack_frame_header(data, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            if frame_type == FRAME_TYPE_MESSAGE and size >= _MESSAGE_FRAME_MIN:
                timestamp, attempts, msg_id = _unpack_message_header(data, pos + 8)
                append(
                    Message(msg_id, data[pos + 8 + MESSAGE_HEADER_SIZE : stop], timestamp, attempts, address, responder)
                )
            elif frame_type == FRAME_TYPE_RESPONSE and size >= 4:
                body = data[pos + 8 : stop]
                if body == _HEARTBEAT_DATA:
                    append(HEARTBEAT)
                else:
                    append(Reply(pending.popleft() if pending else None, body))
            elif frame_type == FRAME_TYPE_ERROR and size >= 4:
                error = NSQError.from_frame(data[pos + 8 : stop])
                if error.code in NON_FATAL_CODES or not pending:
                    append(ErrorReply(None, error))
                else:
                    append(ErrorReply(pending.popleft(), error))
            else:
                raise ConnectionClosed(self._bad_frame(size, frame_type))
            pos = stop
        if pos < end:
            if end - pos >= 8 and (size < 4 or size > _MAX_FRAME_SIZE):
                raise ConnectionClosed(f"corrupt stream from nsqd {self.address}: invalid frame size {size}")
            self._tail.append(data[pos:] if pos else data)
            self._tail_size = end - pos
            self._tail_need = 4 + size if end - pos >= 8 else 8
        return events

    def _bad_frame(self, size: int, frame_type: int) -> str:
        if size < 4 or size > _MAX_FRAME_SIZE:
            return f"corrupt stream from nsqd {self.address}: invalid frame size {size}"
        if frame_type == FRAME_TYPE_MESSAGE:
            return f"corrupt message from nsqd {self.address}: invalid message buffer size ({size - 4})"
        return f"unknown frame type {frame_type} from nsqd {self.address}"

    def take_unparsed(self) -> bytes:
        """Remove and return the stream bytes (decompressed) received past the last event: where a
        driver that parses frames itself takes over (feeding ``decompress(data)`` from then on)."""
        return self._frames.take_unparsed()

    def next_event(self) -> Any:
        """The next event (see the module docstring), or ``NEED_DATA``."""
        try:
            frame = self._frames.next_frame()
        except ProtocolError as exc:
            raise ConnectionClosed(f"corrupt stream from nsqd {self.address}: {exc}") from None
        if frame is None:
            if self._state == _TLS:
                return START_TLS
            return NEED_DATA
        frame_type, data = frame
        if self._state != _CONNECTED:
            return self._handshake_frame(frame_type, data)
        if frame_type == FRAME_TYPE_MESSAGE:
            try:
                return Message.from_frame_data(data, self.address, self.responder)
            except NSQError as exc:
                raise ConnectionClosed(f"corrupt message from nsqd {self.address}: {exc}") from None
        if frame_type == FRAME_TYPE_RESPONSE:
            if data == _HEARTBEAT_DATA:
                return HEARTBEAT
            return Reply(self._pending.popleft() if self._pending else None, data)
        if frame_type == FRAME_TYPE_ERROR:
            error = NSQError.from_frame(data)
            if error.code in NON_FATAL_CODES or not self._pending:
                return ErrorReply(None, error)
            return ErrorReply(self._pending.popleft(), error)
        raise ConnectionClosed(f"unknown frame type {frame_type} from nsqd {self.address}")

    # -- handshake --------------------------------------------------------------------------------

    def _handshake_frame(self, frame_type: int, data: bytes) -> Any:
        state = self._state
        if frame_type == FRAME_TYPE_ERROR:
            raise NSQError.from_frame(data)
        if frame_type != FRAME_TYPE_RESPONSE:
            raise ConnectError(f"unexpected frame type {frame_type} from nsqd {self.address} during the handshake")
        if data == _HEARTBEAT_DATA and state != _IDENTIFY:
            # nsqd's heartbeat timer starts after IDENTIFY; one can arrive while we authenticate
            return self.next_event()
        if state == _IDENTIFY:
            features = self.features = Features.from_response(data)
            if features.tls_v1:
                if self._frames.buffered_size():
                    raise ConnectError(f"nsqd {self.address} sent data before the TLS handshake")
                self._state = _TLS
                return START_TLS
            return self._after_tls()
        if state == _TLS_OK:
            self._expect_ok(data, "TLS")
            return self._after_tls()
        if state == _COMPRESSION_OK:
            self._expect_ok(data, "Deflate" if self.features.deflate else "Snappy")  # type: ignore[union-attr]
            return self._after_compression()
        if state == _AUTH:
            self.auth = _parse_auth(data, self.address)
            return self._connect()
        raise ConnectError(f"unexpected response {data[:100]!r} from nsqd {self.address}")

    def _expect_ok(self, data: bytes, what: str) -> None:
        if data != b"OK":
            raise ConnectError(f"invalid response from {what} upgrade from nsqd {self.address}: {data[:100]!r}")

    def _after_tls(self) -> Any:
        features = self.features
        assert features is not None
        if features.deflate or features.snappy:
            if features.deflate:
                self._decoder = DeflateDecoder()
                self._encoder = DeflateEncoder(features.deflate_level)
            else:
                self._decoder = SnappyDecoder()
                self._encoder = SnappyEncoder()
            self._state = _COMPRESSION_OK
            rest = self._frames.take_unparsed()
            if rest:
                self.receive_data(rest)  # the compressed OK may have come with the previous frame
            return self.next_event()
        return self._after_compression()

    def _after_compression(self) -> Any:
        features = self.features
        assert features is not None
        if features.auth_required:
            if not self.config.auth_secret:
                raise ConnectError(f"nsqd {self.address} requires authorization and no auth_secret is set")
            self._state = _AUTH
            return Send(self.wire_bytes(encode_auth(self.config.auth_secret.encode())))
        return self._connect()

    def _connect(self) -> Connected:
        self._state = _CONNECTED
        assert self.features is not None
        return Connected(self.features, self.auth)


def _parse_auth(data: bytes, address: str) -> AuthResult:
    try:
        obj = json.loads(data)
        return AuthResult(
            identity=str(obj.get("identity", "")),
            identity_url=str(obj.get("identity_url", "")),
            permission_count=int(obj.get("permission_count", 0)),
        )
    except (ValueError, TypeError, AttributeError):
        raise ConnectError(f"invalid AUTH response from nsqd {address}: {data[:200]!r}") from None
